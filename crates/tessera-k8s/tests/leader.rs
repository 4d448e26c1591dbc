//! Leader election (`leader::run`) against kube-rs's mock API service
//! (tower-test). The responder keeps one `coordination.k8s.io/v1` Lease and
//! answers as the v1.28 API server did in the recorded fixture
//! `kube-apiserver-v1.28/10-lease-optimistic-concurrency.json`: create → 201,
//! a second create → 409 AlreadyExists, PUT with the current resourceVersion →
//! 200, with a stale one → 409 Conflict, without one → 422.
//!
//! Time is tokio's paused clock: the election measures expiry on its own
//! monotonic clock, so 15 s leases run in no real time.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use common::{Seen, mock_api, status};
use serde_json::{Value, json};
use tessera_k8s::leader::{LeaderError, Leadership, LeaseConfig, LeaseRole, run};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NAMESPACE: &str = "tessera-system";
const NAME: &str = "tessera-scheduler";
const ME: &str = "replica-a";
const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases/tessera-scheduler";

/// How the mock behaves besides storing the Lease.
#[derive(Default, Clone, Copy, PartialEq)]
enum Mode {
    #[default]
    Plain,
    /// Another replica renews the Lease before every read.
    RivalRenews,
    /// Every request is refused as RBAC would.
    Forbidden,
    /// Writes fail with 500 (reads still work).
    WritesFail,
}

#[derive(Default)]
struct ApiState {
    lease: Option<Value>,
    rv: u64,
    mode: Mode,
    log: Vec<Seen>,
    renewals: u64,
}

#[derive(Clone, Default)]
struct Api(Arc<Mutex<ApiState>>);

fn micro_now() -> Value {
    let t = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    serde_json::to_value(t).unwrap()
}

impl Api {
    fn state(&self) -> MutexGuard<'_, ApiState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_lease(holder: &str, mode: Mode) -> Api {
        let api = Api::default();
        {
            let mut s = api.state();
            s.rv = 100;
            s.mode = mode;
            s.lease = Some(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "100"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "renewTime": micro_now(), "leaseTransitions": 3},
            }));
        }
        api
    }

    fn respond(&self, req: &Seen) -> (u16, Value) {
        let mut s = self.state();
        s.log.push(req.clone());
        if s.mode == Mode::Forbidden {
            return (
                403,
                status(
                    403,
                    "Forbidden",
                    "leases.coordination.k8s.io \"tessera-scheduler\" is forbidden: User \"system:serviceaccount:tessera-system:tessera\" cannot get resource \"leases\"",
                ),
            );
        }
        if s.mode == Mode::RivalRenews
            && let Some(l) = s.lease.as_mut()
        {
            l["spec"]["renewTime"] = micro_now();
            s.rv += 1;
            let rv = s.rv.to_string();
            if let Some(l) = s.lease.as_mut() {
                l["metadata"]["resourceVersion"] = rv.into();
            }
        }
        match req.method.as_str() {
            "GET" => match &s.lease {
                Some(l) => (200, l.clone()),
                None => (
                    404,
                    status(
                        404,
                        "NotFound",
                        "leases.coordination.k8s.io \"tessera-scheduler\" not found",
                    ),
                ),
            },
            _ if s.mode == Mode::WritesFail => (
                500,
                status(500, "InternalError", "etcdserver: request timed out"),
            ),
            "POST" => {
                if s.lease.is_some() {
                    return (
                        409,
                        status(
                            409,
                            "AlreadyExists",
                            "leases.coordination.k8s.io \"tessera-scheduler\" already exists",
                        ),
                    );
                }
                s.rv += 1;
                let mut l = req.body.clone();
                l["metadata"]["resourceVersion"] = s.rv.to_string().into();
                s.lease = Some(l.clone());
                (201, l)
            }
            "PUT" => {
                let sent = req.body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("");
                if sent.is_empty() {
                    return (
                        422,
                        status(
                            422,
                            "Invalid",
                            "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                        ),
                    );
                }
                if sent != s.rv.to_string() {
                    return (
                        409,
                        status(
                            409,
                            "Conflict",
                            "Operation cannot be fulfilled on leases.coordination.k8s.io \"tessera-scheduler\": the object has been modified; please apply your changes to the latest version and try again",
                        ),
                    );
                }
                s.rv += 1;
                s.renewals += 1;
                let mut l = req.body.clone();
                l["metadata"]["resourceVersion"] = s.rv.to_string().into();
                s.lease = Some(l.clone());
                (200, l)
            }
            m => (405, status(405, "MethodNotAllowed", m)),
        }
    }
}

struct Election {
    api: Api,
    flag: Leadership,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), LeaderError>>,
    _server: JoinHandle<Vec<Seen>>,
}

fn config(role: LeaseRole) -> LeaseConfig {
    LeaseConfig::new(NAMESPACE, NAME, ME, role)
}

fn start(api: Api, role: LeaseRole) -> Election {
    let responder = api.clone();
    let (client, server) = mock_api(move |req| responder.respond(req));
    let flag = Leadership::default();
    let (stop, rx) = oneshot::channel();
    let task = tokio::spawn(run(client, config(role), flag.clone(), async move {
        let _ = rx.await;
    }));
    Election {
        api,
        flag,
        stop,
        task,
        _server: server,
    }
}

impl Election {
    async fn stop(self) -> (Api, Result<(), LeaderError>) {
        let _ = self.stop.send(());
        let r = self.task.await.expect("election task");
        (self.api, r)
    }
}

/// Advances paused time in retry-period steps until `cond` holds (at most `limit`).
async fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let step = Duration::from_millis(500);
    let mut waited = Duration::ZERO;
    while waited <= limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
    cond()
}

#[tokio::test(start_paused = true)]
async fn creates_renews_and_releases_the_lease() {
    let e = start(Api::default(), LeaseRole::Elect);
    assert!(within(Duration::from_secs(1), || e.flag.is_leader()).await);
    // Renewals every retry period (2 s), each a PUT with the resourceVersion read.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(e.flag.is_leader());
    let renewals = e.api.state().renewals;
    assert!((3..=4).contains(&renewals), "{renewals} renewals in 7 s");
    let flag = e.flag.clone();
    let (api, r) = e.stop().await;
    r.unwrap();
    assert!(!flag.is_leader());
    let s = api.state();
    let create = s.log.iter().find(|r| r.method == "POST").expect("created");
    assert_eq!(create.body["spec"]["holderIdentity"], ME);
    assert_eq!(create.body["spec"]["leaseDurationSeconds"], 15);
    // MicroTime needs exactly six fractional digits (fixture 10: otherwise 400).
    let renew = create.body["spec"]["renewTime"].as_str().unwrap();
    let frac = renew.split('.').nth(1).unwrap().trim_end_matches('Z');
    assert_eq!(frac.len(), 6, "{renew}");
    let last = s.log.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.path.as_str()),
        ("PUT", LEASE_PATH)
    );
    assert!(
        last.body["spec"]["holderIdentity"].is_null(),
        "released: {}",
        last.body
    );
    assert_eq!(last.body["spec"]["leaseDurationSeconds"], 1);
}

#[tokio::test(start_paused = true)]
async fn follower_while_another_replica_keeps_renewing() {
    let e = start(
        Api::with_lease("replica-b", Mode::RivalRenews),
        LeaseRole::Elect,
    );
    assert!(!within(Duration::from_secs(40), || e.flag.is_leader()).await);
    let (api, r) = e.stop().await;
    r.unwrap();
    assert!(
        api.state().log.iter().all(|r| r.method == "GET"),
        "no write while another leads"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_replicas_lease_is_taken_over_after_its_duration_on_our_clock() {
    let e = start(Api::with_lease("replica-b", Mode::Plain), LeaseRole::Elect);
    // Not before the 15 s lease has gone unrenewed under our eyes …
    assert!(!within(Duration::from_secs(13), || e.flag.is_leader()).await);
    // … and soon after (one retry period).
    assert!(within(Duration::from_secs(5), || e.flag.is_leader()).await);
    let (api, r) = e.stop().await;
    r.unwrap();
    let s = api.state();
    let takeover = s.log.iter().find(|r| r.method == "PUT").unwrap();
    assert_eq!(takeover.body["spec"]["holderIdentity"], ME);
    assert_eq!(takeover.body["spec"]["leaseTransitions"], 4);
    assert_eq!(takeover.body["metadata"]["resourceVersion"], "100");
}

#[tokio::test(start_paused = true)]
async fn election_errors_are_counted_and_kept_not_swallowed() {
    let e = start(Api::default(), LeaseRole::Elect);
    e.api.state().mode = Mode::Forbidden;
    assert!(within(Duration::from_secs(5), || e.flag.errors() >= 2).await);
    assert!(!e.flag.is_leader());
    let err = e.flag.last_error().expect("the last attempt failed");
    assert!(err.contains("forbidden"), "{err}");
    let (_, r) = e.stop().await;
    r.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_leading_before_its_lease_lapses() {
    let e = start(Api::default(), LeaseRole::Elect);
    assert!(within(Duration::from_secs(1), || e.flag.is_leader()).await);
    let failed_at = tokio::time::Instant::now();
    e.api.state().mode = Mode::WritesFail;
    assert!(within(Duration::from_secs(12), || !e.flag.is_leader()).await);
    // Fencing: it stopped within the renew deadline (10 s), before any other
    // replica may take over (15 s after the last renewal it saw).
    assert!(
        failed_at.elapsed() <= Duration::from_secs(11),
        "{:?}",
        failed_at.elapsed()
    );
    let (api, r) = e.stop().await;
    r.unwrap();
    // No longer leader at shutdown: no release is attempted.
    let s = api.state();
    assert!(
        s.log
            .iter()
            .all(|r| !(r.method == "PUT" && r.body["spec"]["holderIdentity"].is_null()))
    );
}

#[tokio::test(start_paused = true)]
async fn follow_leads_while_kube_scheduler_in_this_pod_holds_its_lease() {
    let api = Api::with_lease(
        "replica-a_6c1e0d4e-59b6-4a43-9c55-2f3d0c6f0f7e",
        Mode::RivalRenews,
    );
    let e = start(api, LeaseRole::Follow);
    assert!(within(Duration::from_secs(3), || e.flag.is_leader()).await);
    // kube-scheduler of the other pod takes over: we stop leading at the next read.
    {
        let mut s = e.api.state();
        if let Some(l) = s.lease.as_mut() {
            l["spec"]["holderIdentity"] = "replica-b_0d9c".into();
        }
    }
    assert!(within(Duration::from_secs(3), || !e.flag.is_leader()).await);
    let (api, r) = e.stop().await;
    r.unwrap();
    assert!(
        api.state().log.iter().all(|r| r.method == "GET"),
        "a follower never writes the Lease"
    );
}
