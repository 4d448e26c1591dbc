//! Leader election (`leader::run`, kube-lease-manager underneath) against kube-rs's
//! mock API service (tower-test). The responder keeps one `coordination.k8s.io/v1`
//! Lease and answers GET / POST / PATCH the way the API server would for the
//! patches the lease manager sends (spec fields set, `null` removes). The tests
//! assert on the requests the manager actually made and on the `Leadership` flag.
//!
//! kube-lease-manager measures expiry with `SystemTime`, so these tests run on
//! real time with a 2 s lease and a 1 s grace; every wait is bounded by `LIMIT`.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use common::{Seen, mock_api, status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};
use tessera_k8s::leader::{LeaderError, Leadership, LeaseConfig, run};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NAMESPACE: &str = "tessera-system";
const NAME: &str = "tessera-scheduler";
const ME: &str = "replica-a";
const RIVAL: &str = "replica-b";
const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases/tessera-scheduler";
const COLLECTION_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases";
const APPLY: &str = "application/apply-patch+yaml";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
/// Bounds every wait so that a stuck election fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// What the mock API server holds.
#[derive(Default)]
struct ApiState {
    /// The Lease's spec; `None`: no Lease object.
    spec: Option<Map<String, Value>>,
    /// Another replica holds the lease and renews it continuously (30 s lease):
    /// every GET shows it as holder with a renewTime of now.
    rival: bool,
    resource_version: u64,
    /// Every request, in order.
    log: Vec<Seen>,
}

#[derive(Clone, Default)]
struct Api(Arc<Mutex<ApiState>>);

fn now() -> Value {
    serde_json::to_value(MicroTime(Timestamp::now())).expect("MicroTime serializes")
}

impl Api {
    fn state(&self) -> MutexGuard<'_, ApiState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self) -> Vec<Seen> {
        self.state().log.clone()
    }

    fn lease(s: &ApiState) -> Value {
        let spec = if s.rival {
            json!({
                "holderIdentity": RIVAL, "acquireTime": now(), "renewTime": now(),
                "leaseDurationSeconds": 30, "leaseTransitions": 7,
            })
        } else {
            Value::Object(s.spec.clone().unwrap_or_default())
        };
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "uid": "0b5c3f56-6d7e-4d3a-9a51-2d7f4f1f7e01",
                         "resourceVersion": s.resource_version.to_string()},
            "spec": spec,
        })
    }

    fn respond(&self, req: &Seen) -> (u16, Value) {
        let mut s = self.state();
        s.log.push(req.clone());
        let exists = s.spec.is_some() || s.rival;
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", LEASE_PATH) if exists => (200, Api::lease(&s)),
            ("GET", LEASE_PATH) => (
                404,
                status(
                    404,
                    "NotFound",
                    "leases.coordination.k8s.io \"tessera-scheduler\" not found",
                ),
            ),
            ("POST", COLLECTION_PATH) if exists => (
                409,
                status(
                    409,
                    "AlreadyExists",
                    "leases.coordination.k8s.io \"tessera-scheduler\" already exists",
                ),
            ),
            ("POST", COLLECTION_PATH) => {
                let spec = req.body["spec"].as_object().cloned().unwrap_or_default();
                s.spec = Some(spec);
                s.resource_version += 1;
                (201, Api::lease(&s))
            }
            ("PATCH", LEASE_PATH) if exists => {
                let patch = req.body["spec"].as_object().cloned().unwrap_or_default();
                let spec = s.spec.get_or_insert_with(Map::new);
                for (k, v) in patch {
                    if v.is_null() {
                        spec.remove(&k);
                    } else {
                        spec.insert(k, v);
                    }
                }
                s.resource_version += 1;
                (200, Api::lease(&s))
            }
            ("PATCH", LEASE_PATH) => (404, status(404, "NotFound", "not found")),
            _ => (
                405,
                status(
                    405,
                    "MethodNotAllowed",
                    &format!("{} {}", req.method, req.path),
                ),
            ),
        }
    }
}

struct Election {
    api: Api,
    flag: Leadership,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), LeaderError>>,
    mock: JoinHandle<Vec<Seen>>,
}

fn lease_config() -> LeaseConfig {
    LeaseConfig {
        namespace: NAMESPACE.into(),
        name: NAME.into(),
        identity: ME.into(),
        duration: Duration::from_secs(2),
        grace: Duration::from_secs(1),
    }
}

fn start(api: Api) -> Election {
    let responder = api.clone();
    let (client, mock) = mock_api(move |req| responder.respond(req));
    let flag = Leadership::default();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run(client, lease_config(), flag.clone(), async move {
        let _ = stopped.await;
    }));
    Election {
        api,
        flag,
        stop,
        task,
        mock,
    }
}

impl Election {
    /// Shuts down and returns what `run` returned; the mock's log is complete afterwards.
    async fn shutdown(self) -> (Api, Leadership, Result<(), LeaderError>) {
        let _ = self.stop.send(());
        let result = tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("run returns after shutdown")
            .expect("run did not panic");
        // `run` dropped the client: the mock service sees no further requests.
        let seen = tokio::time::timeout(LIMIT, self.mock)
            .await
            .expect("mock ends once the client is gone")
            .expect("mock task");
        assert_eq!(seen.len(), self.api.log().len());
        (self.api, self.flag, result)
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn is_patch(s: &Seen) -> bool {
    s.method == "PATCH" && s.path == LEASE_PATH
}

/// A patch that takes the lease for `who` (the manager's server-side apply).
fn is_acquire(s: &Seen, who: &str) -> bool {
    is_patch(s) && s.content_type == APPLY && s.body["spec"]["holderIdentity"] == who
}

/// A patch that clears the holder (a release).
fn is_release(s: &Seen) -> bool {
    is_patch(s) && s.body["spec"].get("holderIdentity") == Some(&Value::Null)
}

/// A renewal: our renewTime and duration, holder untouched.
fn is_renewal(s: &Seen) -> bool {
    is_patch(s)
        && s.content_type == STRATEGIC
        && s.body["spec"].get("holderIdentity").is_none()
        && s.body["spec"]["renewTime"].is_string()
        && s.body["spec"]["leaseDurationSeconds"] == 2
}

#[tokio::test]
async fn creates_acquires_renews_and_releases_the_lease() {
    let e = start(Api::default());
    let flag = e.flag.clone();
    wait_for("leadership", || flag.is_leader()).await;

    let log = e.api.log();
    // The Lease did not exist: GET → 404, then POST creates it, named, with an empty spec.
    assert_eq!(
        (log[0].method.as_str(), log[0].path.as_str()),
        ("GET", LEASE_PATH)
    );
    assert_eq!(log[1].method, "POST", "{log:#?}");
    assert_eq!(log[1].path, COLLECTION_PATH);
    assert_eq!(log[1].body["metadata"]["name"], NAME);
    assert!(
        log[1].body["spec"].get("holderIdentity").is_none(),
        "{:?}",
        log[1].body
    );
    // Then it took the lease for itself, with the configured duration and its field manager.
    let acquire = log
        .iter()
        .position(|s| is_acquire(s, ME))
        .unwrap_or_else(|| panic!("no acquiring patch: {log:#?}"));
    let a = &log[acquire];
    assert_eq!(a.body["spec"]["leaseDurationSeconds"], 2);
    assert!(a.body["spec"]["renewTime"].is_string() && a.body["spec"]["acquireTime"].is_string());
    assert!(
        a.query
            .contains("fieldManager=kube-lease-manager-replica-a"),
        "{}",
        a.query
    );
    // ... and counted the transition.
    assert!(
        log[acquire + 1..].iter().any(|s| is_patch(s)
            && s.content_type == STRATEGIC
            && s.body["spec"]["leaseTransitions"] == 1),
        "{log:#?}"
    );
    assert_eq!(e.api.state().spec.as_ref().unwrap()["holderIdentity"], ME);

    // Before the 2 s lease runs out (1 s grace) the leader renews it and stays leader.
    let api = e.api.clone();
    wait_for("a renewal", || {
        api.log().iter().skip(acquire + 1).any(is_renewal)
    })
    .await;
    assert!(e.flag.is_leader());
    assert!(
        !e.api.log().iter().any(is_release),
        "released while leading"
    );

    let (api, flag, result) = e.shutdown().await;
    result.expect("run ends cleanly");
    assert!(!flag.is_leader(), "the flag drops on shutdown");
    // On shutdown the lease is released: the holder cleared so the other replica takes over at once.
    let log = api.log();
    let release = log
        .iter()
        .rposition(is_release)
        .unwrap_or_else(|| panic!("no release on shutdown: {log:#?}"));
    let r = &log[release];
    assert_eq!(r.content_type, STRATEGIC);
    for field in ["renewTime", "acquireTime", "leaseDurationSeconds"] {
        assert_eq!(
            r.body["spec"].get(field),
            Some(&Value::Null),
            "{field}: {:?}",
            r.body
        );
    }
    assert!(!log[release + 1..].iter().any(is_patch), "{log:#?}");
    let spec = api.state().spec.clone().unwrap();
    assert!(spec.get("holderIdentity").is_none(), "{spec:?}");
}

#[tokio::test]
async fn follower_while_another_replica_holds_a_fresh_lease() {
    let api = Api::default();
    api.state().rival = true;
    let e = start(api);
    // Construction GETs the Lease, the watcher GETs it again to learn its holder.
    let api = e.api.clone();
    wait_for("the watcher's sync", || {
        api.log().iter().filter(|s| s.method == "GET").count() >= 2
    })
    .await;
    // Give the watcher a moment to act on what it saw (it must only wait for expiry).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!e.flag.is_leader());

    let (api, flag, result) = e.shutdown().await;
    result.expect("run ends cleanly");
    assert!(!flag.is_leader());
    let log = api.log();
    // Never tried to take the held lease, never created one, and did not clear
    // the other replica's lease on its way out.
    assert!(!log.iter().any(|s| s.method != "GET"), "{log:#?}");
}

#[tokio::test]
async fn leadership_is_lost_when_another_replica_holds_the_lease() {
    let e = start(Api::default());
    let flag = e.flag.clone();
    wait_for("leadership", || flag.is_leader()).await;
    let before = e.api.log().len();

    // Another replica now holds the lease (e.g. after a partition) and keeps it fresh.
    e.api.state().rival = true;
    wait_for("loss of leadership", || !flag.is_leader()).await;
    let log = e.api.log();
    // It found out on its renewal: it renewed, re-read the Lease and saw the other holder.
    assert!(log[before..].iter().any(is_renewal), "{log:#?}");
    assert_eq!(log.last().unwrap().method, "GET", "{log:#?}");

    let (api, flag, result) = e.shutdown().await;
    result.expect("run ends cleanly");
    assert!(!flag.is_leader());
    let log = api.log();
    // Not the holder any more: shutdown must not clear the other replica's lease,
    // and it never grabs it back while it is fresh.
    assert!(!log[before..].iter().any(is_release), "{log:#?}");
    assert!(!log[before..].iter().any(|s| is_acquire(s, ME)), "{log:#?}");
}

#[tokio::test]
async fn an_expired_lease_of_a_dead_replica_is_taken_over() {
    let api = Api::default();
    let long_ago = Timestamp::now() - SignedDuration::from_secs(600);
    let stale = serde_json::to_value(MicroTime(long_ago)).unwrap();
    api.state().spec = Some(
        json!({"holderIdentity": RIVAL, "acquireTime": stale, "renewTime": stale,
               "leaseDurationSeconds": 2, "leaseTransitions": 3})
        .as_object()
        .cloned()
        .unwrap(),
    );
    let e = start(api);
    let flag = e.flag.clone();
    wait_for("leadership", || flag.is_leader()).await;
    let log = e.api.log();
    // The dead holder's lease is cleared first, then taken, and the transition counted.
    let release = log
        .iter()
        .position(is_release)
        .expect("expired lease released");
    let acquire = log
        .iter()
        .position(|s| is_acquire(s, ME))
        .expect("lease taken");
    assert!(release < acquire, "{log:#?}");
    assert!(
        !log.iter().any(|s| s.method == "POST"),
        "the Lease existed: {log:#?}"
    );
    let spec = e.api.state().spec.clone().unwrap();
    assert_eq!(spec["holderIdentity"], ME);
    assert_eq!(spec["leaseTransitions"], 4, "{spec:?}");

    let (_, flag, result) = e.shutdown().await;
    result.expect("run ends cleanly");
    assert!(!flag.is_leader());
}
