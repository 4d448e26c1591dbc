//! Leader election on a coordination Lease, with fencing: only the leader binds.
//!
//! The algorithm is client-go's `leaderelection` (the one kube-scheduler runs):
//! read the Lease; take it over only when its holder has not renewed it for a
//! whole `duration` *as observed on our own clock* (never trusting another
//! machine's timestamps); renew it every `retry_period` with the Lease's
//! resourceVersion as a precondition, so two replicas can never both succeed.
//!
//! Fencing: leadership is a deadline, not a flag. A successful acquire or renew
//! makes this replica leader until the attempt's start plus `renew_deadline`,
//! which is shorter than `duration`; if renewals fail (API down, process paused)
//! [`Leadership::is_leader`] turns false by itself before any other replica may
//! take over. The binder checks it right before each write.
//!
//! Two ways to lead:
//! - **elect** (standalone mode): this process competes for its own Lease.
//! - **follow** (extender mode): kube-scheduler, in the same pod, runs its own
//!   election; we lead exactly while the kube-scheduler Lease names this pod
//!   (`<pod>_<uuid>`, kube-scheduler's identity) and keeps being renewed. The
//!   kube-scheduler that schedules then always calls the Tessera that may bind,
//!   and a failover needs no second election.
//!
//! Every error is logged, counted and kept for the readiness answer: a replica
//! that cannot read its Lease (RBAC, network) says so instead of idling silently.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this replica leads, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Lead {
    leading: bool,
    /// `None`: no deadline (a single replica without election, tests).
    until: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    lead: watch::Sender<Lead>,
    /// Where another replica that leads now takes forwarded calls (its Lease's
    /// [`PEER_ANNOTATION`]); `None` while this one leads or none is known.
    peer: watch::Sender<Option<String>>,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// Whether this replica leads now (shared, cheap to clone).
#[derive(Debug, Clone)]
pub struct Leadership(Arc<Inner>);

impl Default for Leadership {
    fn default() -> Self {
        Leadership(Arc::new(Inner {
            lead: watch::channel(Lead::default()).0,
            peer: watch::channel(None).0,
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }))
    }
}

impl Leadership {
    /// A replica that leads from the start, with no deadline (single replica, tests).
    pub fn always() -> Leadership {
        let l = Leadership::default();
        l.set(true);
        l
    }

    /// Leader now: elected and the deadline of the last renewal not passed.
    pub fn is_leader(&self) -> bool {
        let lead = *self.0.lead.borrow();
        lead.leading && lead.until.is_none_or(|t| Instant::now() < t)
    }

    /// How long this replica still leads without another renewal: `None` when it
    /// leads with no deadline, zero when it does not lead.
    pub fn remaining(&self) -> Option<Duration> {
        let lead = *self.0.lead.borrow();
        if !lead.leading {
            return Some(Duration::ZERO);
        }
        lead.until
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// Leads (or not) with no deadline.
    pub fn set(&self, leader: bool) {
        self.set_until(leader, None);
    }

    /// Leads (or not) until `until` (the election sets it after each renewal).
    pub fn set_until(&self, leading: bool, until: Option<Instant>) {
        let new = Lead { leading, until };
        self.0.lead.send_if_modified(|old| {
            let flipped = old.leading != new.leading;
            *old = new;
            flipped
        });
    }

    /// Resolves the next time leadership is gained or lost (deadline expiries
    /// are noticed at the next renewal attempt).
    pub async fn changed(&self) {
        let mut rx = self.0.lead.subscribe();
        let _ = rx.changed().await;
    }

    /// Where the replica that leads now takes forwarded calls, if another
    /// replica leads and advertised one (see [`PEER_ANNOTATION`]).
    pub fn leader_endpoint(&self) -> Option<String> {
        self.0.peer.borrow().clone()
    }

    /// Records the leader's endpoint (the election, after each Lease read).
    pub fn set_leader_endpoint(&self, endpoint: Option<String>) {
        self.0.peer.send_if_modified(|old| {
            let changed = *old != endpoint;
            *old = endpoint;
            changed
        });
    }

    /// Resolves when leadership flips or the leader's endpoint changes, or after `limit`.
    pub async fn changed_within(&self, limit: Duration) {
        let mut lead = self.0.lead.subscribe();
        let mut peer = self.0.peer.subscribe();
        tokio::select! {
            _ = lead.changed() => {}
            _ = peer.changed() => {}
            _ = tokio::time::sleep(limit) => {}
        }
    }

    /// Resolves once this replica leads, or the Lease names a leader other
    /// than the one at `endpoint`. A call forwarded to `endpoint` and not yet
    /// answered may then be given up and made again where the lead is now:
    /// the replica at `endpoint` no longer holds the Lease, so by its
    /// deadline it no longer writes (a hung or frozen leader whose socket
    /// still accepts, issue 41 defect 12).
    pub async fn moved_from(&self, endpoint: &str) {
        let mut lead = self.0.lead.subscribe();
        let mut peer = self.0.peer.subscribe();
        loop {
            let elsewhere = peer
                .borrow_and_update()
                .as_deref()
                .is_some_and(|e| e != endpoint);
            if self.is_leader() || elsewhere {
                return;
            }
            tokio::select! {
                r = lead.changed() => if r.is_err() { return std::future::pending().await },
                r = peer.changed() => if r.is_err() { return std::future::pending().await },
            }
        }
    }

    /// Election errors so far.
    pub fn errors(&self) -> u64 {
        self.0.errors.load(Ordering::Relaxed)
    }

    /// The last election error, if the last attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.0
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn record(&self, result: Result<(), String>) {
        let mut last = self.0.last_error.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => *last = None,
            Err(e) => {
                self.0.errors.fetch_add(1, Ordering::Relaxed);
                *last = Some(e);
            }
        }
    }
}

/// Annotation on an elected leader's Lease: the URL where it takes calls that
/// followers forward to it (`--advertise-url`), written in the same update that
/// takes or renews the Lease, so it always names the holder.
pub const PEER_ANNOTATION: &str = "tessera.io/peer-endpoint";

/// Compete for the Lease, or follow kube-scheduler's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRole {
    Elect,
    Follow,
}

/// Where the Lease lives and how long it lasts.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    pub role: LeaseRole,
    /// How long a holder's Lease lasts without renewal (client-go `LeaseDuration`, 15 s).
    pub duration: Duration,
    /// How long a leader keeps leading without a successful renewal (`RenewDeadline`, 10 s).
    pub renew_deadline: Duration,
    /// How often the Lease is read or renewed (`RetryPeriod`, 2 s).
    pub retry_period: Duration,
    /// Where followers reach this replica when it leads (elect only), written
    /// to the Lease as [`PEER_ANNOTATION`].
    pub advertise: Option<String>,
}

impl LeaseConfig {
    /// kube-scheduler's defaults.
    pub fn new(namespace: &str, name: &str, identity: &str, role: LeaseRole) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            role,
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            advertise: None,
        }
    }

    fn holds(&self, holder: &str) -> bool {
        match self.role {
            LeaseRole::Elect => holder == self.identity,
            // kube-scheduler's identity is `<hostname>_<uuid>`; a pod's hostname is its name.
            LeaseRole::Follow => holder
                .strip_prefix(self.identity.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('_')),
        }
    }
}

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{name}: {message}")]
pub struct LeaderError {
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// The holder and renewal last seen, and when we saw them change (our clock).
#[derive(Debug, Default)]
struct Observed {
    record: Option<(String, Option<Timestamp>, Option<i32>)>,
    at: Option<Instant>,
    /// The holder's advertised endpoint, as last read.
    endpoint: Option<String>,
}

impl Observed {
    fn see(&mut self, spec: &LeaseSpec, now: Instant) {
        let record = (
            spec.holder_identity.clone().unwrap_or_default(),
            spec.renew_time.as_ref().map(|t| t.0),
            spec.lease_duration_seconds,
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.at = Some(now);
        }
    }

    /// The holder (non-empty) has renewed within `duration` of our clock.
    fn held_by_other(&self, config: &LeaseConfig, now: Instant) -> bool {
        let Some((holder, _, secs)) = &self.record else {
            return false;
        };
        let duration = secs
            .and_then(|s| u64::try_from(s).ok())
            .map_or(config.duration, Duration::from_secs);
        !holder.is_empty() && !config.holds(holder) && self.at.is_some_and(|at| now < at + duration)
    }
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn spec_for(config: &LeaseConfig, old: Option<&LeaseSpec>) -> LeaseSpec {
    let now = micro_now();
    let taking_over = old.is_none_or(|o| o.holder_identity.as_deref() != Some(&config.identity));
    let transitions = old.and_then(|o| o.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(config.duration.as_secs()).unwrap_or(15)),
        acquire_time: if taking_over {
            Some(now.clone())
        } else {
            old.and_then(|o| o.acquire_time.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if taking_over && old.is_some() {
            transitions + 1
        } else {
            transitions
        }),
        ..LeaseSpec::default()
    }
}

/// One round: read the Lease, then acquire or renew it if we may. Returns
/// whether we lead after it; `Err` is a failed API call (leadership then
/// lapses at its deadline).
async fn attempt(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, String> {
    let current = api
        .get_opt(&config.name)
        .await
        .map_err(|e| format!("reading the Lease: {e}"))?;
    let now = Instant::now();
    let Some(lease) = current else {
        if config.role == LeaseRole::Follow {
            return Ok(false);
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                annotations: config
                    .advertise
                    .clone()
                    .map(|url| [(PEER_ANNOTATION.to_string(), url)].into()),
                ..ObjectMeta::default()
            },
            spec: Some(spec_for(config, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(format!("creating the Lease: {e}")),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    observed.see(&spec, now);
    observed.endpoint = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PEER_ANNOTATION))
        .cloned();
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if config.role == LeaseRole::Follow {
        return Ok(config.holds(holder) && !observed.held_by_other(config, now));
    }
    if observed.held_by_other(config, now) {
        return Ok(false);
    }
    let mut next = lease.clone();
    next.metadata.managed_fields = None;
    next.spec = Some(spec_for(config, Some(&spec)));
    let annotations = next
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match &config.advertise {
        Some(url) => annotations.insert(PEER_ANNOTATION.into(), url.clone()),
        None => annotations.remove(PEER_ANNOTATION),
    };
    // `replace` sends the resourceVersion we read: a rival's write in between makes it 409.
    match api
        .replace(&config.name, &PostParams::default(), &next)
        .await
    {
        Ok(written) => {
            if let Some(s) = &written.spec {
                observed.see(s, now);
            }
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(format!("renewing the Lease: {e}")),
    }
}

/// Gives the Lease up so that another replica takes over at once.
async fn release(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), String> {
    let lease = api
        .get(&config.name)
        .await
        .map_err(|e| format!("reading the Lease to release it: {e}"))?;
    let mut spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(micro_now());
    let mut next = lease;
    next.metadata.managed_fields = None;
    next.spec = Some(spec);
    api.replace(&config.name, &PostParams::default(), &next)
        .await
        .map(|_| ())
        .map_err(|e| format!("releasing the Lease: {e}"))
}

/// Takes part in the election until `shutdown` resolves, keeping `flag` current.
/// On shutdown an elected leader releases the Lease so another replica takes
/// over at once. Errors are logged, counted in `flag` and retried; the result
/// is the release's outcome.
pub async fn run(
    client: kube::Client,
    config: LeaseConfig,
    flag: Leadership,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaderError> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut observed = Observed::default();
    tokio::pin!(shutdown);
    loop {
        let started = Instant::now();
        let was = flag.is_leader();
        match attempt(&api, &config, &mut observed).await {
            Ok(true) => {
                let until = match config.role {
                    LeaseRole::Elect => started + config.renew_deadline,
                    // Valid while kube-scheduler could still be renewing, measured from when we saw it renew.
                    LeaseRole::Follow => observed.at.unwrap_or(started) + config.renew_deadline,
                };
                flag.set_until(true, Some(until));
                flag.record(Ok(()));
            }
            Ok(false) => {
                flag.set_until(false, None);
                flag.record(Ok(()));
            }
            Err(e) => {
                tracing::warn!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, error = %e, "leader election failed; retrying");
                flag.record(Err(e));
            }
        }
        let now_leading = flag.is_leader();
        // Followers forward to the holder while its Lease is live on our clock.
        let live_other = config.role == LeaseRole::Elect
            && !now_leading
            && observed.held_by_other(&config, Instant::now());
        flag.set_leader_endpoint(if live_other {
            observed.endpoint.clone()
        } else {
            None
        });
        if was != now_leading {
            tracing::info!(leading = now_leading, identity = %config.identity, "leadership changed");
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(config.retry_period) => {}
        }
    }
    let leading = flag.is_leader();
    flag.set_until(false, None);
    flag.set_leader_endpoint(None);
    if leading && config.role == LeaseRole::Elect {
        release(&api, &config)
            .await
            .map_err(|message| LeaderError {
                namespace: config.namespace.clone(),
                name: config.name.clone(),
                message,
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_matches_kube_scheduler_identities_of_this_pod_only() {
        let c = LeaseConfig::new("ns", "l", "tessera-0", LeaseRole::Follow);
        assert!(c.holds("tessera-0_6f1c2d3e-aaaa"));
        assert!(c.holds("tessera-0"));
        assert!(!c.holds("tessera-01_6f1c"));
        assert!(!c.holds("tessera-1_6f1c"));
        let e = LeaseConfig::new("ns", "l", "tessera-0", LeaseRole::Elect);
        assert!(!e.holds("tessera-0_6f1c"));
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_lapses_at_its_deadline_without_renewal() {
        let l = Leadership::default();
        assert!(!l.is_leader());
        l.set_until(true, Some(Instant::now() + Duration::from_secs(10)));
        assert!(l.is_leader());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(l.is_leader());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(
            !l.is_leader(),
            "a leader that could not renew stops by itself"
        );
        assert!(Leadership::always().is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_is_respected_until_its_lease_lapses_on_our_clock() {
        let c = LeaseConfig::new("ns", "l", "me", LeaseRole::Elect);
        let mut o = Observed::default();
        let spec = LeaseSpec {
            holder_identity: Some("rival".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            ..LeaseSpec::default()
        };
        let t0 = Instant::now();
        o.see(&spec, t0);
        // A renewTime far in the past does not matter: only what we observe counts.
        assert!(o.held_by_other(&c, t0 + Duration::from_secs(14)));
        o.see(&spec, t0 + Duration::from_secs(14));
        assert!(!o.held_by_other(&c, t0 + Duration::from_secs(15)));
        let mut released = spec.clone();
        released.holder_identity = None;
        o.see(&released, t0 + Duration::from_secs(1));
        assert!(!o.held_by_other(&c, t0 + Duration::from_secs(1)));
    }
}
