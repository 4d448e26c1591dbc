//! Releasing claims whose `NodeUnprepareResources` never comes.
//!
//! The kubelet unprepares a claim when its last pod on the node is done. When
//! it never does (its state lost or reset, the node drained while the agent was
//! down and the kubelet's checkpoint wiped, a claim force-deleted), the claim's
//! MIG instance, MPS daemon and CDI spec would be kept forever, while the
//! scheduler, seeing the claim gone, hands the same placement out again.
//!
//! So every [`SWEEP_PERIOD`], and once when the driver is registered, each
//! prepared claim ([`super::records::PreparedClaim`]) is read again. It is
//! *gone* only when the API server says so: the claim does not exist (a 404
//! for the object, [`ClaimError::NotFound`]), a claim of that name has another
//! UID, or it is no longer allocated a device of this node's pool by this
//! driver. Anything else keeps it: an error, a timeout, the API unreachable, an
//! answer that cannot be told apart. A claim recorded without a name (by an
//! older agent) cannot be read and is only logged.
//!
//! A claim is released only when two sweeps at least a period apart both found
//! it gone. One reading is a snapshot, and a wrong release destroys a MIG
//! instance under a running container: the kubelet's own unprepare may be in
//! flight (the claim controller can deallocate a claim before the kubelet has
//! unprepared it, and that unprepare is the normal path, to be left its
//! chance), an API server that restarts or lags can answer from a stale cache,
//! and a claim deleted and recreated is read mid-way. A verdict that holds a
//! whole period later is no transient; the cost is one period more of the leak.
//!
//! Release is [`Preparer::release`], the very code of `NodeUnprepareResources`,
//! so a later real unprepare of the claim finds nothing to do and succeeds.
//! [`decide`] is the pure core; [`Sweeper`] reads claims and applies it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::DRIVER_NAME;
use super::prepare::{ClaimError, Preparer, ResourceClaim};
use super::records::PreparedClaim;
use super::service::ClaimRef;
use crate::metrics::ReleasedClaims;

/// How often prepared claims are checked (and so the least time between the
/// two "gone" verdicts a release needs).
pub const SWEEP_PERIOD: Duration = Duration::from_secs(5 * 60);
/// How long one claim read may take before it counts as an error (keep).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a prepared claim is no longer in use on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gone {
    /// No claim of that name exists.
    Deleted,
    /// A claim of that name exists with another UID (deleted and recreated).
    Replaced { uid: String },
    /// The claim has no allocation any more.
    Deallocated,
    /// Its allocation names none of its devices in this node's pool for this driver.
    AllocatedElsewhere,
}

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gone::Deleted => write!(f, "the claim no longer exists"),
            Gone::Replaced { uid } => write!(f, "the claim of that name now has UID {uid}"),
            Gone::Deallocated => write!(f, "the claim is no longer allocated"),
            Gone::AllocatedElsewhere => write!(
                f,
                "the claim's allocation no longer names its devices on this node"
            ),
        }
    }
}

/// Whether the claim `uid`, prepared as `prepared` on `node`, is gone, by the
/// answer the API server gave for its name. `None`: keep it.
pub fn verdict(
    read: &Result<ResourceClaim, ClaimError>,
    uid: &str,
    prepared: &PreparedClaim,
    node: &str,
) -> Option<Gone> {
    let claim = match read {
        Err(ClaimError::NotFound { .. }) => return Some(Gone::Deleted),
        Err(ClaimError::Unreadable(_)) => return None,
        Ok(c) => c,
    };
    // A claim without a UID is not one the API server returns: no verdict on it.
    if claim.metadata.uid.is_empty() {
        return None;
    }
    if claim.metadata.uid != uid {
        return Some(Gone::Replaced {
            uid: claim.metadata.uid.clone(),
        });
    }
    let Some(allocation) = &claim.status.allocation else {
        return Some(Gone::Deallocated);
    };
    let here = allocation.devices.results.iter().any(|r| {
        r.driver == DRIVER_NAME
            && r.pool == node
            && (prepared.devices.is_empty() || prepared.devices.contains(&r.device))
    });
    if here {
        None
    } else {
        Some(Gone::AllocatedElsewhere)
    }
}

/// What a sweep does with one prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// In use, or not known to be gone: keep it (and forget any earlier verdict).
    Keep,
    /// Gone, first found so at `since`: keep it until a sweep a period later agrees.
    GoneOnce { since: Instant, why: Gone },
    /// Gone now and a period ago: release it.
    Release { why: Gone },
}

/// The two-sweeps rule: `gone` is this sweep's verdict, `first_gone` when
/// consecutive sweeps before it first found the claim gone, `now` this sweep's
/// time. Released only once the verdict has held for at least `period`.
pub fn decide(
    gone: Option<Gone>,
    first_gone: Option<Instant>,
    now: Instant,
    period: Duration,
) -> Decision {
    let Some(why) = gone else {
        return Decision::Keep;
    };
    match first_gone {
        Some(since) if now.saturating_duration_since(since) >= period => Decision::Release { why },
        Some(since) => Decision::GoneOnce { since, why },
        None => Decision::GoneOnce { since: now, why },
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Claims released (UIDs).
    pub released: Vec<String>,
    /// Claims found gone for the first time, or not yet for a period (UIDs).
    pub pending: Vec<String>,
}

/// Sweeps one [`Preparer`]'s claims; remembers first verdicts between sweeps.
pub struct Sweeper {
    preparer: Arc<Preparer>,
    period: Duration,
    released: ReleasedClaims,
    /// Per claim UID: when consecutive sweeps first found it gone.
    first_gone: BTreeMap<String, Instant>,
    /// Claims known by UID only, already logged.
    logged_unnamed: BTreeSet<String>,
}

impl Sweeper {
    /// Counts releases in `released` (the driver's `/metrics`).
    pub fn new(preparer: Arc<Preparer>, released: ReleasedClaims) -> Self {
        Sweeper {
            preparer,
            period: SWEEP_PERIOD,
            released,
            first_gone: BTreeMap::new(),
            logged_unnamed: BTreeSet::new(),
        }
    }

    /// One sweep at `now` (the caller's clock, so tests drive it).
    pub async fn sweep(&mut self, now: Instant) -> SweepReport {
        let records = self.preparer.records().await;
        let source = self.preparer.claim_source();
        let mut report = SweepReport::default();
        let mut first_gone = BTreeMap::new();
        for uid in records.claim_uids() {
            let Some(prepared) = records.claims.get(&uid).filter(|c| !c.name.is_empty()) else {
                if self.logged_unnamed.insert(uid.clone()) {
                    tracing::warn!(claim_uid = %uid, "prepared claim recorded without its name (by an older agent): only its unprepare releases it");
                }
                continue;
            };
            let read = tokio::time::timeout(
                READ_TIMEOUT,
                source.get(&prepared.namespace, &prepared.name),
            )
            .await
            .unwrap_or_else(|_| {
                Err(ClaimError::Unreadable(format!(
                    "no answer in {READ_TIMEOUT:?}"
                )))
            });
            if let Err(ClaimError::Unreadable(e)) = &read {
                tracing::debug!(claim = %format!("{}/{}", prepared.namespace, prepared.name), error = %e, "prepared claim not read; kept");
            }
            let gone = verdict(&read, &uid, prepared, self.preparer.node());
            match decide(gone, self.first_gone.get(&uid).copied(), now, self.period) {
                Decision::Keep => {}
                Decision::GoneOnce { since, why } => {
                    if since == now {
                        tracing::info!(claim = %format!("{}/{}", prepared.namespace, prepared.name), claim_uid = %uid, reason = %why, "prepared claim looks gone; released if still so after {:?}", self.period);
                    }
                    first_gone.insert(uid.clone(), since);
                    report.pending.push(uid);
                }
                Decision::Release { why } => {
                    if self.release(&uid, prepared, &why).await {
                        report.released.push(uid);
                    } else if let Some(since) = self.first_gone.get(&uid) {
                        // Tried again at the next sweep, if still gone.
                        first_gone.insert(uid.clone(), *since);
                        report.pending.push(uid);
                    }
                }
            }
        }
        self.first_gone = first_gone;
        report
    }

    /// Releases one claim as its unprepare would; false if that failed.
    async fn release(&self, uid: &str, prepared: &PreparedClaim, why: &Gone) -> bool {
        let claim = ClaimRef {
            namespace: prepared.namespace.clone(),
            name: prepared.name.clone(),
            uid: uid.to_string(),
        };
        let who = format!("{}/{}", claim.namespace, claim.name);
        match self.preparer.release(&claim).await {
            Ok(r) if r.is_nothing() => {
                tracing::debug!(claim = %who, claim_uid = %uid, "claim unprepared meanwhile; nothing to release");
                true
            }
            Ok(r) => {
                self.released.inc();
                tracing::info!(
                    claim = %who,
                    claim_uid = %uid,
                    reason = %why,
                    cdi_spec_removed = r.spec,
                    mig_instances_destroyed = ?r.instances,
                    mps_daemon_released = ?r.mps,
                    "released a claim whose unprepare never came"
                );
                true
            }
            Err(e) => {
                tracing::warn!(claim = %who, claim_uid = %uid, reason = %why, error = %e, "cannot release a claim whose unprepare never came; retrying at the next sweep");
                false
            }
        }
    }
}

/// Sweeps once now, then every [`SWEEP_PERIOD`], forever (the caller aborts it).
pub async fn run(mut sweeper: Sweeper) {
    loop {
        let report = sweeper.sweep(Instant::now()).await;
        if !report.released.is_empty() || !report.pending.is_empty() {
            tracing::debug!(
                released = report.released.len(),
                pending = report.pending.len(),
                "claim sweep"
            );
        }
        tokio::time::sleep(sweeper.period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const UID: &str = "uid-1";

    fn prepared(devices: &[&str]) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: "train".into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            holds: Vec::new(),
        }
    }

    fn claim(uid: &str, allocation: Option<Value>) -> Result<ResourceClaim, ClaimError> {
        let mut c = json!({"metadata": {"name": "train", "namespace": "ml", "uid": uid}});
        if let Some(results) = allocation {
            c["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        Ok(serde_json::from_value(c).unwrap())
    }

    fn result(driver: &str, pool: &str, device: &str) -> Value {
        json!({"request": "gpu", "driver": driver, "pool": pool, "device": device})
    }

    /// Gone only on the API server's word; every other answer keeps the claim.
    #[test]
    fn verdicts() {
        let p = prepared(&["gpu-0"]);
        let here = json!([result(DRIVER_NAME, "node-a", "gpu-0")]);
        let cases: Vec<(&str, Result<ResourceClaim, ClaimError>, Option<Gone>)> = vec![
            (
                "404 for the claim",
                Err(ClaimError::NotFound {
                    namespace: "ml".into(),
                    name: "train".into(),
                }),
                Some(Gone::Deleted),
            ),
            (
                "error, timeout, unreachable",
                Err(ClaimError::Unreadable("connection refused".into())),
                None,
            ),
            ("still allocated here", claim(UID, Some(here.clone())), None),
            (
                "recreated under the same name",
                claim("uid-2", Some(here.clone())),
                Some(Gone::Replaced {
                    uid: "uid-2".into(),
                }),
            ),
            ("no UID: not a verdict", claim("", None), None),
            ("deallocated", claim(UID, None), Some(Gone::Deallocated)),
            (
                "allocated on another node",
                claim(UID, Some(json!([result(DRIVER_NAME, "node-b", "gpu-0")]))),
                Some(Gone::AllocatedElsewhere),
            ),
            (
                "another driver's device of this pool",
                claim(UID, Some(json!([result("other.io", "node-a", "gpu-0")]))),
                Some(Gone::AllocatedElsewhere),
            ),
            (
                "another device of this node",
                claim(UID, Some(json!([result(DRIVER_NAME, "node-a", "gpu-1")]))),
                Some(Gone::AllocatedElsewhere),
            ),
            (
                "one of several results is ours",
                claim(
                    UID,
                    Some(json!([
                        result("other.io", "node-b", "x"),
                        result(DRIVER_NAME, "node-a", "gpu-0")
                    ])),
                ),
                None,
            ),
        ];
        for (what, read, want) in cases {
            assert_eq!(verdict(&read, UID, &p, "node-a"), want, "{what}");
        }
        // Devices not recorded: any device of this pool keeps it.
        let any = claim(UID, Some(json!([result(DRIVER_NAME, "node-a", "gpu-7")])));
        assert_eq!(verdict(&any, UID, &prepared(&[]), "node-a"), None);
    }

    /// Released only when the verdict held on two sweeps at least a period apart;
    /// a "keep" in between starts over.
    #[test]
    fn two_sweeps_a_period_apart() {
        let period = Duration::from_secs(300);
        let t0 = Instant::now();
        let gone = || Some(Gone::Deleted);
        // First verdict: pending, since now.
        assert_eq!(
            decide(gone(), None, t0, period),
            Decision::GoneOnce {
                since: t0,
                why: Gone::Deleted
            }
        );
        // A sweep sooner than a period later (t0 + 299 s): still pending, since t0.
        assert_eq!(
            decide(gone(), Some(t0), t0 + Duration::from_secs(299), period),
            Decision::GoneOnce {
                since: t0,
                why: Gone::Deleted
            }
        );
        // t0 + 300 s: released.
        assert_eq!(
            decide(gone(), Some(t0), t0 + period, period),
            Decision::Release { why: Gone::Deleted }
        );
        // Not gone any more: kept, whatever came before.
        assert_eq!(decide(None, Some(t0), t0 + period, period), Decision::Keep);
        assert_eq!(decide(None, None, t0, period), Decision::Keep);
        // A clock that went backwards never releases.
        assert!(matches!(
            decide(gone(), Some(t0 + period), t0, period),
            Decision::GoneOnce { .. }
        ));
    }
}
