//! A stateful test double of the Kubernetes API calls Tessera makes, served
//! as a `tower::Service` that `kube::Client::new(service, "default")` takes.
//!
//! It copies the behaviour of the real kube-apiserver v1.28.0 recorded in
//! `../shared/fixtures/kube-apiserver-v1.28/` (file numbers below refer to it);
//! `tests/apiserver/main.rs` replays those recordings against it.
//!
//! - One global resourceVersion counter for every kind; a delete costs two
//!   (README rules; file 08). [`store`]
//! - LIST with `limit`/`continue` at the first page's resourceVersion,
//!   `resourceVersion=0` ignoring `limit` (file 09), 410 with a replacement
//!   token for an expired continue (file 15). WATCH as a stream of JSON lines:
//!   ADDED/MODIFIED/DELETED, BOOKMARK at the server-side timeout (file 08),
//!   synthetic ADDED without a resourceVersion or with `0` (file 18), HTTP 200
//!   plus `ERROR` 410 from an expired one (file 14); field selectors
//!   `spec.nodeName=` / `spec.schedulerName=` with an object leaving the
//!   selector reported as DELETED (files 08, 17). [`store`], [`select`], [`watch`]
//! - PATCH (merge, strategic merge, JSON patch, apply) and PUT:
//!   `metadata.resourceVersion` as a precondition → 409 (files 05, 07); pods
//!   allow unconditional update, leases do not → 422 (files 07, 10);
//!   `spec.nodeName` immutable → 422 (file 06); gates may only be removed
//!   (file 12). A `metadata.uid` that differs from the stored one is a 422
//!   `field is immutable`: that is the API server's `BeforeUpdate` (no
//!   recording has it). [`patch`], [`pods`]
//! - `pods/NAME/binding`: no node check (file 02); 409 `pods/binding` if
//!   assigned (even to the same node, file 01), gated (file 12) or being
//!   deleted (file 16); `metadata.uid`/`resourceVersion` preconditions → 409
//!   (file 04); validation → 400/500 (file 17). The Binding's
//!   `metadata.annotations` are merged into the pod in the same write that
//!   sets `nodeName` and `PodScheduled=True`, as `BindingREST` does. [`pods`]
//! - DELETE: unbound pods go at once, bound pods stay terminating with
//!   `deletionTimestamp` until `gracePeriodSeconds=0`; finalizers hold them;
//!   DeleteOptions preconditions (file 16). Eviction as file 11 shows it,
//!   PodDisruptionBudgets included: 429 `TooManyRequests` for a budget not
//!   yet processed (`Retry-After: 10`) or with no disruption left, one taken
//!   from an allowed one; Pending and terminating pods skip them. Pod creates
//!   over the API pass the Priority admission plugin (`priorityClassName`
//!   resolved into `spec.priority`, an unknown class 403). [`pods`]
//! - Leases: 409 AlreadyExists, PUT with a stale resourceVersion → 409,
//!   without one → 422, MicroTime without six fractional digits → 400
//!   (file 10); server-side apply with per-field managers and 409 on a field
//!   another manager set, which kube-lease-manager 0.13 relies on (it takes the
//!   lease with an apply patch, renews and releases with strategic patches;
//!   not recorded, modelled on the API server's field manager). [`leases`]
//! - Events: core/v1 and events.k8s.io/v1 accepted and counted, with the
//!   recorded events.k8s.io validation (file 13). [`events`]
//! - `resource.k8s.io/v1` ResourceClaims (with `status`), ResourceSlices and
//!   DeviceClasses: create, get, list, watch, patch, delete with the generic
//!   rules above. Not recorded (the fixtures are v1.28): the claim rules of
//!   the v1.34+ API server's strategy and validation are modelled in [`dra`]
//!   and [`validation`] (ResourceSlices on create and update; a claim's
//!   status: results, request names, `shareID`, no new consumer once being
//!   deleted). Objects other than pods that finalizers hold stay, with a
//!   `deletionTimestamp`, until the last one is removed (the generic store).
//! - `kueue.x-k8s.io/v1beta1` Workloads and AdmissionChecks, as custom
//!   resources with a status subresource: the generic rules above, and the
//!   apiextensions server's status strategy ([`kueue`]).
//!
//! Beyond the real server: per-request latency (seeded, uniform in a range,
//! half before and half after the write, plus a per-item cost for LISTs so a
//! restarted client's lists take as long as a big cluster's), counters by
//! verb and of requests in flight, a log of every write, and faults per
//! [`Session`] (one scheduler process): fail its N-th write with a 500 (or
//! commit it and answer 504, as a server whose request timed out does), or
//! "crash" it before or after its N-th write is applied. A crashed session
//! never gets another answer, as if the process died at that instant; the
//! test then drops the process's runtime ([`process`]).
//!
//! Not modelled: authentication and RBAC, admission webhooks, namespaces as
//! a precondition, the disruption controller (a budget's status is what a
//! test writes), admission plugins other than Priority, the watch cache lagging the server's
//! counter on `resourceVersion=0` lists, and one storage for core/v1 and
//! events.k8s.io events. [`check`], [`dra_check`], [`cluster`] and [`crash`]
//! are for scheduler tests: the invariants judged from stored objects (grants;
//! DRA claims), nodes and pods to seed, and the crash-and-restart loop.

#![allow(dead_code)]

pub mod check;
pub mod cluster;
pub mod crash;
pub mod dra;
pub mod dra_check;
mod events;
mod handler;
pub mod kueue;
pub mod leases;
mod list;
pub mod patch;
mod pods;
pub mod process;
pub mod select;
pub mod status;
pub mod store;
pub mod tcp;
mod update;
pub mod validation;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http::{Request, Response};
use kube::client::Body as KubeBody;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch as flag;

pub use status::ApiError;
pub use store::Resource;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the double behaves beyond the recorded rules.
#[derive(Debug, Clone)]
pub struct Config {
    /// Each request takes a uniform random time in this range.
    pub latency: (Duration, Duration),
    /// Seeds latencies, uids and generated names.
    pub seed: u64,
    /// Changes kept for watches and paginated lists (the watch cache window).
    pub watch_window: usize,
    /// Ends every watch after at most this long (the server's `timeoutSeconds`).
    pub watch_timeout_cap: Option<Duration>,
    /// Extra time a LIST takes per item returned: a big cluster's list takes
    /// hundreds of milliseconds (issue 9: 22–593 ms with 5,000 pods).
    pub list_latency_per_item: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            latency: (Duration::ZERO, Duration::ZERO),
            seed: 0,
            watch_window: 100_000,
            watch_timeout_cap: None,
            list_latency_per_item: Duration::ZERO,
        }
    }
}

/// What a session's N-th write does instead of succeeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answered `500 InternalError`, nothing written.
    Fail,
    /// Written, but answered `504 Timeout` as if the request outlived its deadline.
    FailAfter,
    /// The process dies before the server sees the request.
    CrashBefore,
    /// The write is committed; the process dies before the answer arrives.
    CrashAfter,
}

/// One write (POST, PUT, PATCH, DELETE) as the double answered it.
#[derive(Debug, Clone)]
pub struct WriteRecord {
    pub session: u64,
    pub at: Instant,
    pub method: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub subresource: String,
    pub status: u16,
    /// The global resourceVersion after the write.
    pub rv: u64,
}

/// Requests seen so far.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// By `verb resource[/subresource]`, e.g. `create pods/binding`.
    pub by_request: BTreeMap<String, u64>,
    pub in_flight: i64,
    pub max_in_flight: i64,
    /// Binding POSTs in flight at once, at most.
    pub max_binds_in_flight: i64,
}

impl Counters {
    /// Requests of one verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub fn verb(&self, verb: &str) -> u64 {
        self.by_request
            .iter()
            .filter(|(k, _)| k.split(' ').next() == Some(verb))
            .map(|(_, n)| n)
            .sum()
    }
}

pub(crate) struct SessionState {
    writes: u64,
    faults: Vec<(u64, Fault)>,
    dead: flag::Sender<bool>,
    died_at: Option<Instant>,
    started: Instant,
    /// When the process first had a complete LIST of each resource.
    listed: HashMap<String, Instant>,
}

impl SessionState {
    pub(crate) fn die(&mut self) {
        if self.died_at.is_none() {
            self.died_at = Some(Instant::now());
        }
        let _ = self.dead.send(true);
    }
}

/// Everything behind the lock.
pub(crate) struct State {
    pub store: store::Store,
    pub rng: SmallRng,
    pub config: Config,
    pub sessions: HashMap<u64, SessionState>,
    next_session: u64,
    pub counters: BTreeMap<String, u64>,
    pub writes: Vec<WriteRecord>,
    /// Lease field managers: lease key → field → manager (server-side apply).
    pub lease_owners: HashMap<store::Key, BTreeMap<String, String>>,
}

impl State {
    /// A uid shaped like the server's (random, seeded).
    pub fn uid(&mut self) -> String {
        let a: u128 = self.rng.random();
        let h = format!("{a:032x}");
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[0..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..32]
        )
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    in_flight: AtomicI64,
    max_in_flight: AtomicI64,
    binds_in_flight: AtomicI64,
    max_binds_in_flight: AtomicI64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The double: cheap to clone, shared by every client made from it.
#[derive(Clone)]
pub struct ApiServer(Arc<Shared>);

impl ApiServer {
    pub fn new(config: Config) -> ApiServer {
        let state = State {
            // The recordings' counter was past 200 when they began; start there.
            store: store::Store::new(config.watch_window, 200),
            rng: SmallRng::seed_from_u64(config.seed),
            config,
            sessions: HashMap::new(),
            next_session: 1,
            counters: BTreeMap::new(),
            writes: Vec::new(),
            lease_owners: HashMap::new(),
        };
        ApiServer(Arc::new(Shared {
            state: Mutex::new(state),
            in_flight: AtomicI64::new(0),
            max_in_flight: AtomicI64::new(0),
            binds_in_flight: AtomicI64::new(0),
            max_binds_in_flight: AtomicI64::new(0),
        }))
    }

    /// A new session (one client process) and its service.
    pub fn service(&self) -> (ApiService, Session) {
        let (tx, rx) = flag::channel(false);
        let id = {
            let mut st = self.0.lock();
            let id = st.next_session;
            st.next_session += 1;
            st.sessions.insert(
                id,
                SessionState {
                    writes: 0,
                    faults: Vec::new(),
                    dead: tx,
                    died_at: None,
                    started: Instant::now(),
                    listed: HashMap::new(),
                },
            );
            id
        };
        let session = Session {
            id,
            shared: self.0.clone(),
            dead: rx.clone(),
        };
        (
            ApiService {
                shared: self.0.clone(),
                session: id,
                dead: rx,
            },
            session,
        )
    }

    /// A kube client on a new session. Call it inside the runtime that will
    /// use the client: kube's request buffer runs as a task there.
    pub fn client(&self) -> (kube::Client, Session) {
        let (service, session) = self.service();
        (kube::Client::new(service, "default"), session)
    }

    /// Creates an object as a POST would (defaults, validation, uid,
    /// resourceVersion), but without the admission plugins (Priority): a
    /// seeded object is stored as if admitted long ago, its `spec.priority`
    /// as given. Requests over the service go through admission.
    pub fn create<K: Serialize>(&self, resource: Resource, obj: &K) -> Result<Value, ApiError> {
        let value = serde_json::to_value(obj).map_err(|e| status::bad_request(e.to_string()))?;
        let mut st = self.0.lock();
        handler::create(&mut st, resource, &value).map(|o| (*o).clone())
    }

    /// Every stored object of a resource, decoded.
    pub fn objects<K: DeserializeOwned>(&self, resource: Resource) -> Vec<K> {
        let st = self.0.lock();
        st.store
            .all(resource)
            .filter_map(|o| serde_json::from_value((**o).clone()).ok())
            .collect()
    }

    /// Stored objects of a resource for which `keep` holds.
    pub fn count(&self, resource: Resource, keep: impl Fn(&Value) -> bool) -> usize {
        let st = self.0.lock();
        st.store.all(resource).filter(|o| keep(o)).count()
    }

    /// One stored object as JSON.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        let st = self.0.lock();
        st.store
            .get(resource, &(namespace.to_string(), name.to_string()))
            .map(|o| (**o).clone())
    }

    pub fn resource_version(&self) -> u64 {
        self.0.lock().store.rv
    }

    /// Forgets all history: every older resourceVersion is expired from now on.
    pub fn compact(&self) {
        self.0.lock().store.compact();
    }

    pub fn set_latency(&self, min: Duration, max: Duration) {
        self.0.lock().config.latency = (min, max.max(min));
    }

    pub fn counters(&self) -> Counters {
        let st = self.0.lock();
        Counters {
            by_request: st.counters.clone(),
            in_flight: self.0.in_flight.load(Ordering::Relaxed),
            max_in_flight: self.0.max_in_flight.load(Ordering::Relaxed),
            max_binds_in_flight: self.0.max_binds_in_flight.load(Ordering::Relaxed),
        }
    }

    /// When session `id` started, and when it first had a complete LIST of
    /// each resource (by plural), for telling what a process knew when it wrote.
    pub fn session_times(&self, id: u64) -> Option<(Instant, HashMap<String, Instant>)> {
        let st = self.0.lock();
        st.sessions.get(&id).map(|s| (s.started, s.listed.clone()))
    }

    pub fn writes(&self) -> Vec<WriteRecord> {
        self.0.lock().writes.clone()
    }

    /// Watches open now.
    pub fn watchers(&self) -> usize {
        self.0.lock().store.watchers()
    }
}

/// One client process's view of the double, with its faults.
#[derive(Clone)]
pub struct Session {
    pub id: u64,
    shared: Arc<Shared>,
    dead: flag::Receiver<bool>,
}

impl Session {
    /// Makes this session's `nth` write (1-based, counted from its start) fault.
    pub fn fault(&self, nth: u64, fault: Fault) {
        if let Some(s) = self.shared.lock().sessions.get_mut(&self.id) {
            s.faults.push((nth, fault));
        }
    }

    /// The process dies now: no request of it is answered any more.
    pub fn kill(&self) {
        if let Some(s) = self.shared.lock().sessions.get_mut(&self.id) {
            s.die();
        }
    }

    /// When the session died, if it did.
    pub fn died_at(&self) -> Option<Instant> {
        self.shared
            .lock()
            .sessions
            .get(&self.id)
            .and_then(|s| s.died_at)
    }

    pub fn is_dead(&self) -> bool {
        *self.dead.borrow()
    }

    /// Resolves once the session died (a crash fault or [`Session::kill`]).
    pub async fn died(&self) {
        let mut rx = self.dead.clone();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Writes this session has sent so far.
    pub fn writes(&self) -> u64 {
        self.shared
            .lock()
            .sessions
            .get(&self.id)
            .map_or(0, |s| s.writes)
    }
}

/// The `tower::Service` a kube client runs on.
#[derive(Clone)]
pub struct ApiService {
    shared: Arc<Shared>,
    session: u64,
    dead: flag::Receiver<bool>,
}

/// Counts a request in flight until dropped (answered, or abandoned by a dead
/// process); Binding POSTs are also counted on their own.
struct InFlight(Arc<Shared>, bool);

impl InFlight {
    fn new(shared: Arc<Shared>, binding: bool) -> InFlight {
        let now = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::Relaxed);
        if binding {
            let now = shared.binds_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            shared.max_binds_in_flight.fetch_max(now, Ordering::Relaxed);
        }
        InFlight(shared, binding)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.1 {
            self.0.binds_in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

async fn never() -> ! {
    std::future::pending::<()>().await;
    unreachable!("a pending future never resolves")
}

impl tower::Service<Request<KubeBody>> for ApiService {
    type Response = Response<axum::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<KubeBody>) -> Self::Future {
        let shared = self.shared.clone();
        let session = self.session;
        let dead = self.dead.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let binding =
                parts.method == http::Method::POST && parts.uri.path().ends_with("/binding");
            let _counted = InFlight::new(shared.clone(), binding);
            let body: Bytes = body.collect_bytes().await.unwrap_or_default();
            let is_dead = *dead.borrow();
            if is_dead {
                never().await;
            }
            let latency = {
                let mut st = shared.lock();
                let (lo, hi) = st.config.latency;
                if hi > lo {
                    st.rng.random_range(lo..=hi)
                } else {
                    lo
                }
            };
            if !latency.is_zero() {
                tokio::time::sleep(latency / 2).await;
            }
            let outcome = handler::serve(&shared, session, &parts, &body, dead.clone());
            let response = match outcome {
                handler::Outcome::Hang => never().await,
                handler::Outcome::Dropped => {
                    return Err("connection closed before message completed".into());
                }
                handler::Outcome::Respond(r, extra) => (r, extra),
            };
            let (response, extra) = response;
            let after = latency - latency / 2 + extra;
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
            let is_dead = *dead.borrow();
            if is_dead {
                never().await;
            }
            Ok(response)
        })
    }
}
