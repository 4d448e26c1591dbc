//! Standalone mode's pods with DRA `ResourceClaim`s (`--dra`, issue 29 item 2).
//!
//! Deciding, under the mirror's lock and then the DRA view's (that order,
//! always): the pod's CPU, memory and countable resources are judged as for
//! any pod ([`crate::mirror::Mirror::host_fitting`], with
//! [`super::node_allows`]); among the nodes that pass, [`crate::dra::place`]
//! picks the one where every claim allocates with the best score of the core
//! policy. The pod's host resources are then held in the mirror, and each new
//! allocation assumed in the view's overlay, so the next decision, made before
//! any write is answered or watched, already counts them.
//!
//! Quotas: the GPUs the pod's claims take count against its queue as grants
//! do ([`crate::dra::quota`]: whole GPUs, shares and MIG placements in
//! GPU-equivalents). They are known only once the node is chosen (what
//! `allocationMode: All` takes depends on it), so the quota is checked on the
//! plan, before anything is held; a pod over quota waits with the same
//! sentence and reason (`queue quota`) as on the device-plugin path. What
//! allocated claims hold is told to the mirror (`count_claims`, at each
//! pass and each decision, and at once for a decided pod), so queue usage,
//! fair shares and borrowing count it, whoever allocated the claims.
//!
//! One ledger for grants and claims on a node in both worlds (its `GpuNode`
//! still lists GPUs its slices publish, issue 41): a claim's decision counts
//! what `tessera.io` grants hold of those GPUs
//! ([`crate::dra::inventory::grant_holdings`]), and the mirror's ledger counts
//! what claims hold of them ([`crate::dra::inventory::gpu_holds`], told at
//! `count_claims`), so neither side gives a GPU the other holds.
//!
//! Applying, in the background: each claim's write in the pod's order
//! (`status.allocation` + `reservedFor`, or `reservedFor` alone for a claim
//! allocated already), each with the claim's resourceVersion as precondition;
//! only when every one is written is the pod bound, with a plain Binding (no
//! `tessera.io/allocation`: the claims say what the pod holds) through
//! [`crate::binder::Binder::write`]. A 409 is never overwritten: the pod is
//! decided again on a later pass, from the claim the watch then shows. If a
//! later claim's write fails, the earlier claims stay allocated and reserved
//! for the pod, as with kube-scheduler; the retry finds them allocated and
//! only reserves or binds (which is also how a restarted scheduler finishes a
//! pod whose claims it wrote before it died). A claim write that fails in a
//! way that may have landed (a 5xx, a lost connection, no answer) keeps its
//! devices assumed taken until the watch shows whether it landed; meanwhile
//! the pod's retry writes the same allocation again, at the resourceVersion
//! the first write had as precondition, instead of taking the assumption for
//! the truth (which bound the pod with its claim unallocated when the first
//! write had not landed).
//!
//! Gang members with claims are decided by [`decide_dra_locked`] too, all
//! the gang under both locks ([`super::gang`]): each member sees what the
//! earlier ones assumed, and a gang that does not fit drops its assumptions
//! ([`DraDecided::unassume`]) with its holds. Written as single pods are,
//! one by one, so a member whose write fails is decided again alone.
//!
//! A pod whose claims fit on no node may evict pods that hold claims of our
//! driver (`dra_preempt.rs`): lower-priority pods of its queue, or, when its
//! queue is within its guarantee, pods of queues borrowing beyond theirs; it
//! is then placed by a later pass, once they are gone.
//!
//! Not done here: pods asking both `tessera.io/*` resources and claims.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tessera_core::model::Catalog;
use tessera_core::placement::Placement;
use tessera_core::queue::GpuEquivalents;
use tessera_core::request::GpuAsk;
use tokio::time::Instant;

use super::{Standalone, node_allows, selector_matches, unsupported};
use crate::binder::{BindError, Binder};
use crate::convert;
use crate::dra::cel::Env;
use crate::dra::choose::Host;
use crate::dra::inventory::{Holdings, NodeInventory, gpu_holds, grant_holdings};
use crate::dra::place::Plan;
use crate::dra::place::place;
use crate::dra::pod::{NotReady, PodClaim, Step, learned_ask, pod_claims};
use crate::dra::quota::{Devices, devices_milli, pod_holdings};
use crate::dra::types::{AllocationResult, ConsumerReference, ResourceClaim};
use crate::dra::view::{DraView, SharedDraView};
use crate::dra::write::{
    PodRef, WriteError, Written, allocation_result, protect, write_allocation, write_reservation,
};
use crate::metrics::Metrics;
use crate::mirror::{Mirror, QuotaCheck, Reservation};
use crate::preemptor::Nominated;

/// Whether and how this scheduler allocates claims.
#[derive(Clone, Default)]
pub enum Dra {
    /// `--dra` not given: pods with claims are refused with a reason.
    #[default]
    Off,
    /// `--dra` given, but the API server does not serve `resource.k8s.io/v1` (why).
    Unserved(String),
    On(SharedDraView),
}

impl Dra {
    /// The view to allocate `pod`'s claims from, or why they are not
    /// allocated (the event sentence and the metrics reason).
    pub(super) fn view(&self, pod: &Pod) -> Result<&SharedDraView, (String, String)> {
        let key = convert::pod_key(pod);
        match self {
            Dra::Off => Err((
                format!(
                    "pod {key} uses DRA ResourceClaims: this scheduler allocates them only when run with --dra (standalone mode)"
                ),
                "dra off".into(),
            )),
            Dra::Unserved(reason) => Err((
                format!(
                    "pod {key} uses DRA ResourceClaims, but {reason}: Tessera cannot allocate them"
                ),
                "dra unserved".into(),
            )),
            Dra::On(view) => Ok(view),
        }
    }
}

/// Longest wait for the API's answer to one claim write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why placing a pod failed after it was decided.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(
        "ResourceClaim {claim} changed since it was read (409 Conflict): nothing was overwritten; the pod is decided again from the claim as it is now"
    )]
    ClaimConflict { claim: String },
    #[error(transparent)]
    Claim(#[from] WriteError),
    #[error(
        "writing ResourceClaim {claim}: no answer within {secs} s; its devices stay assumed taken until the watch shows the outcome"
    )]
    ClaimTimeout { claim: String, secs: u64 },
    #[error("this replica is not the leader; only the leader writes claims")]
    NotLeader,
}

/// One claim write: a new allocation (with the reservation), or the reservation alone.
pub(super) struct ClaimWrite {
    claim: ResourceClaim,
    allocation: Option<AllocationResult>,
    /// The allocation was written before and that write's outcome is
    /// unknown; this writes it again, with the claim as the watch shows it
    /// (the same resourceVersion, so at most one of the two lands). Whatever
    /// this one comes to, the assumption stays until the watch settles it.
    again: bool,
}

/// A decided DRA pod: its node and the claim writes before its Binding.
pub(super) struct DraDecided {
    pub(super) node: String,
    writes: Vec<ClaimWrite>,
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: convert::pod_uid(pod).to_string(),
    }
}

fn key(c: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `claim` as it will be once `allocation` and the reservation for `pod` are written.
fn as_written(claim: &ResourceClaim, allocation: &AllocationResult, pod: &PodRef) -> ResourceClaim {
    let mut c = claim.clone();
    let mut status = c.status.take().unwrap_or_default();
    status.allocation = Some(allocation.clone());
    if !status.reserved_for.iter().any(|r| r.uid == pod.uid) {
        status.reserved_for.push(ConsumerReference {
            api_group: None,
            resource: "pods".into(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            extra: Default::default(),
        });
    }
    c.status = Some(status);
    c
}

fn uid_of(c: &ResourceClaim) -> &str {
    c.metadata.uid.as_deref().unwrap_or_default()
}

impl Standalone {
    /// Places (or refuses) a pod with claims: see the module docs.
    pub(super) async fn attempt_dra(&mut self, pod: Pod) {
        let view = match self.dra.view(&pod) {
            Ok(view) => view.clone(),
            Err((why, reason)) => return self.failed(&pod, why, reason),
        };
        match self.decide_dra(&view, &pod) {
            Err((message, reason)) => match self.preempt_dra(&view, &pod, &reason).await {
                Some(preempting) => self.failed(
                    &pod,
                    format!("{message}; {preempting}"),
                    "preempting".into(),
                ),
                None => self.failed(&pod, message, reason),
            },
            Ok(d) => self.spawn_dra(view, pod, d),
        }
    }

    /// Writes a decided pod's claims, then binds it, in the background.
    pub(super) fn spawn_dra(&mut self, view: SharedDraView, pod: Pod, d: DraDecided) {
        self.preemptor.placed(convert::pod_uid(&pod));
        let binder = self.binder.clone();
        self.binds.spawn(async move {
            let node = d.node.clone();
            let outcome = write_then_bind(&binder, &view, &pod, d).await;
            (pod, node, outcome)
        });
    }

    /// Decides the pod's node and claim allocations, holds its host resources
    /// in the mirror and assumes its allocations in the view, in one critical
    /// section. `Err` carries the event sentence and the metrics reason.
    fn decide_dra(&self, view: &SharedDraView, pod: &Pod) -> Result<DraDecided, (String, String)> {
        let nominated = self.preemptor.nominated();
        let mut m = self.mirror.lock();
        let mut v = view.lock();
        decide_dra_locked(&mut m, &mut v, &self.metrics, pod, &nominated)
    }
}

/// [`Standalone::decide_dra`] on a mirror and a view the caller has locked,
/// in that order (a gang decides all its members under both locks, so each
/// member's decision counts the allocations assumed for the members before it).
pub(super) fn decide_dra_locked(
    m: &mut Mirror,
    v: &mut DraView,
    metrics: &Metrics,
    pod: &Pod,
    nominated: &Nominated,
) -> Result<DraDecided, (String, String)> {
    let started = std::time::Instant::now();
    let key = convert::pod_key(pod);
    let invalid = |e: String| (e, "invalid request".to_string());
    let catalog = m.cluster().catalog.clone();
    let asks = convert::pod_asks(pod, &catalog);
    let req = asks.request.map_err(|e| invalid(e.to_string()))?;
    let host = asks.host.map_err(invalid)?;
    if req.gpu != GpuAsk::None {
        return Err(invalid(format!(
            "pod {key} asks both tessera.io GPUs and DRA ResourceClaims: ask for devices one way"
        )));
    }
    if let Some(why) = unsupported(pod) {
        return Err((why, "unsupported".to_string()));
    }
    let now = Instant::now();
    v.expire(now);
    let mut usage = count_claims(m, v);
    let classes = v.classes();
    let claims = pod_claims(pod, |ns, n| v.claim(ns, n), &classes).map_err(|e| match e {
        NotReady::Wait(m) => (m, "waiting for claims".to_string()),
        NotReady::Refuse(m) => (m, "claims refused".to_string()),
    })?;
    m.learn_claim_pod(pod, learned_ask(&claims));
    let inventories = v.inventories().clone();
    // What claims hold, and what device-plugin grants hold of the same GPUs.
    let (cluster, grants) = m.grants();
    usage.add(&grant_holdings(cluster, grants, &inventories));
    let (nodes, policy) = m
        .host_fitting(&req, &host, |facts| {
            node_allows(pod, facts).and_then(|()| nominated.check(pod, &facts.name))
        })
        .map_err(|e| (e.to_string(), e.top_reason()))?;
    let facts: Vec<_> = nodes.iter().map(|(_, f, _)| f.clone()).collect();
    let hosts: BTreeMap<String, Host> = nodes
        .iter()
        .map(|(_, f, room)| {
            let host = Host {
                cpu_milli: room.cpu_milli,
                memory_mib: room.memory_mib,
                free_cpu_milli: room.free_cpu_milli,
                free_memory_mib: room.free_memory_mib,
                ask_cpu_milli: req.cpu_milli,
                ask_memory_mib: req.memory_mib,
            };
            (f.name.clone(), host)
        })
        .collect();
    let plan = place(
        &claims,
        &facts,
        &inventories,
        &usage,
        policy,
        &Env::new(),
        &selector_matches,
        &hosts,
    )
    .map_err(|e| (e.sentence(), "claims do not fit".to_string()))?;
    metrics.observe_decision("standalone", started.elapsed());
    let ask = claims_milli(
        &catalog,
        m.gpu_equivalents(),
        &inventories,
        &claims,
        &plan,
        &pod_ref(pod).uid,
    );
    if let QuotaCheck::Refused(why) = m.quota_with_claims(pod, &req, ask) {
        return Err((why, "queue quota".to_string()));
    }
    let Some(id) = nodes
        .iter()
        .find(|(_, f, _)| f.name == plan.node)
        .map(|(id, _, _)| *id)
    else {
        return Err((
            format!("node {} left the candidates", plan.node),
            "ledger refused".into(),
        ));
    };
    let placement = Placement {
        node: id,
        cpu_milli: req.cpu_milli,
        memory_mib: req.memory_mib,
        ..Placement::default()
    };
    match m.hold(pod, placement, req, host) {
        Ok(Reservation::Write { .. }) => {}
        Ok(Reservation::AlreadyBound) => {
            return Err((format!("pod {key} is bound already"), "bound".into()));
        }
        Err(e) => return Err((e.to_string(), "ledger refused".into())),
    }
    let who = pod_ref(pod);
    let mut writes = Vec::new();
    for (i, c) in claims.iter().enumerate() {
        match &c.step {
            // Ours, assumed, but its write failed and may not have landed:
            // write it again rather than bind the pod on the strength of it.
            // (`pod_claims` found it through the watch, so `watched` has it.)
            Step::Ready if v.outcome_unknown(uid_of(&c.claim)) => {
                let read = v.watched(&c.claim).cloned();
                let allocation = c.claim.status.as_ref().and_then(|s| s.allocation.clone());
                if let (Some(claim), Some(allocation)) = (read, allocation) {
                    // Assumed again, in flight: its devices stay taken while
                    // this write goes, whatever the watch shows meanwhile. An
                    // entry of unknown outcome ends once the watch shows the
                    // claim changed, and the first write's delete protection
                    // landing is such a change: without this, another claim
                    // was given the devices while this write was on its way
                    // (both allocated, seen in `dra_crash_restart` seed 24).
                    v.assume(as_written(&claim, &allocation, &who), now);
                    writes.push(ClaimWrite {
                        claim,
                        allocation: Some(allocation),
                        again: true,
                    });
                }
            }
            Step::Ready => {}
            Step::Reserve => writes.push(ClaimWrite {
                claim: c.claim.clone(),
                allocation: None,
                again: false,
            }),
            Step::Allocate(_) => {
                let Some((_, alloc)) = plan.allocations.iter().find(|(j, _)| *j == i) else {
                    continue;
                };
                let result = allocation_result(alloc, uid_of(&c.claim));
                v.assume(as_written(&c.claim, &result, &who), now);
                writes.push(ClaimWrite {
                    claim: c.claim.clone(),
                    allocation: Some(result),
                    again: false,
                });
            }
        }
    }
    // What the allocations just assumed hold of GPUs a `GpuNode` lists, told
    // to the ledger at once: a `tessera.io` pod tried next in this pass is not
    // granted them (found on a real 1.36 control plane, e2e `dra_handover`).
    m.set_claims_on_gpus(gpu_holds(&v.usage(), v.inventories()));
    // Counted in the queue's usage at once, as the mirror's hold counts
    // a grant: the next decision and the queue report see it.
    if ask > 0 {
        m.hold_claims(&who.uid, ask);
    }
    Ok(DraDecided {
        node: plan.node,
        writes,
    })
}

/// Tells the mirror what the allocated claims hold, per pod, so queues count
/// them in their usage, and of GPUs, so its ledger counts them; returns what
/// they hold by device ([`DraView::usage`]), for the caller's decision. Called
/// with the mirror's lock held, then the view's.
pub(super) fn count_claims(m: &mut Mirror, v: &mut DraView) -> Holdings {
    let catalog = m.cluster().catalog.clone();
    let (claims, inventories) = v.claims_and_inventories();
    let held = pod_holdings(&catalog, m.gpu_equivalents(), inventories, claims);
    m.set_claim_holdings(held);
    // What they hold of GPUs a `GpuNode` may still list: the ledger counts it,
    // so no `tessera.io` pod is granted those GPUs too.
    let usage = v.usage();
    m.set_claims_on_gpus(gpu_holds(&usage, v.inventories()));
    usage
}

/// What the view finds wrong, once per pass: counted in
/// `tessera_dra_problems` and told to the mirror, so the web view lists it.
pub(super) fn tell_problems(m: &mut Mirror, v: &mut DraView, metrics: &Metrics) {
    let problems = v.problems();
    metrics.set_dra_problems(problems.len());
    m.set_dra_problems(problems);
}

/// Milli GPU-equivalents the pod `uid`'s claims take once `plan` is applied:
/// the devices it allocates on the plan's node, and those of its claims
/// allocated already and reserved for no other pod (a claim another pod holds
/// counts against that pod's queue).
pub(super) fn claims_milli(
    catalog: &Catalog,
    ge: &GpuEquivalents,
    inventories: &BTreeMap<String, NodeInventory>,
    claims: &[PodClaim],
    plan: &Plan,
    uid: &str,
) -> u64 {
    let new: u64 = plan
        .allocations
        .iter()
        .map(|(_, a)| {
            let results = a
                .results
                .iter()
                .filter(|c| !c.admin_access)
                .map(|c| (&c.device, &c.consumed));
            devices_milli(catalog, ge, inventories, &plan.node, results)
        })
        .sum();
    let devices = Devices::new(inventories);
    let held: u64 = claims
        .iter()
        .filter(|c| !matches!(c.step, Step::Allocate(_)))
        .filter(|c| {
            c.claim
                .status
                .as_ref()
                .is_none_or(|s| s.reserved_for.iter().all(|r| r.uid == uid))
        })
        .map(|c| devices.claim_milli(catalog, ge, &c.claim))
        .sum();
    new + held
}

/// Drops what was assumed for `writes` (none of them was written). Exact:
/// a claim is assumed only when the view showed it unallocated, so no earlier
/// assumption of the same claim is dropped with it. A write again of an
/// allocation whose first write may have landed is not dropped: it goes back
/// to its outcome being unknown, so its devices stay taken until the watch
/// shows the claim changed since it was read.
fn unassume(v: &mut DraView, writes: &[ClaimWrite]) {
    for w in writes.iter().filter(|w| w.allocation.is_some()) {
        if w.again {
            v.unknown(&w.claim);
        } else {
            v.forget(uid_of(&w.claim));
        }
    }
}

/// The write `w` failed and may have landed. A new allocation stays assumed
/// (the devices may be taken) but with its outcome unknown, so that its pod
/// is not bound on the strength of it ([`decide_dra_locked`] writes it again).
fn outcome_unknown(view: &SharedDraView, w: &ClaimWrite) {
    if w.allocation.is_some() {
        view.lock().unknown(&w.claim);
    }
}

fn abandon(view: &SharedDraView, writes: &[ClaimWrite]) {
    unassume(&mut view.lock(), writes);
}

impl DraDecided {
    /// Drops the allocations deciding assumed in the view, none of them
    /// written (a gang that does not fit undoes its members so, with their
    /// holds in the mirror).
    pub(super) fn unassume(&self, v: &mut DraView) {
        unassume(v, &self.writes);
    }
}

/// Writes the claims in order, then binds; on a failure, what was not written
/// is given back (the mirror's hold, the overlay's assumptions) and the pod
/// is retried.
async fn write_then_bind(
    binder: &Binder,
    view: &SharedDraView,
    pod: &Pod,
    d: DraDecided,
) -> Result<(), PlaceError> {
    let who = pod_ref(pod);
    let failed = |from: usize, e: PlaceError| {
        abandon(view, &d.writes[from..]);
        binder.mirror().lock().unreserve(&who.uid);
        Err(e)
    };
    for (k, w) in d.writes.iter().enumerate() {
        // Fenced as Bindings are: started only with enough leadership left,
        // and finished within it (issue 41, defect 5: checked once, then
        // 10 s allowed, a write could land after another replica took over).
        let Some(budget) = binder.write_budget(Duration::ZERO) else {
            return failed(k, PlaceError::NotLeader);
        };
        let budget = budget.min(WRITE_TIMEOUT);
        let call = async {
            match &w.allocation {
                Some(a) => {
                    // Delete protection first, as kube-scheduler does (issue 41, defect 3).
                    let claim = match protect(binder.client(), &w.claim).await? {
                        Written::Allocated(c) => c,
                        Written::Conflict => return Ok(Written::Conflict),
                    };
                    if claim.metadata.resource_version != w.claim.metadata.resource_version {
                        view.lock().rebase(&claim);
                    }
                    write_allocation(binder.client(), &claim, a, &who).await
                }
                None => write_reservation(binder.client(), &w.claim, &who).await,
            }
        };
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(Written::Allocated(c))) => view.lock().written(*c, Instant::now()),
            Ok(Ok(Written::Conflict)) => {
                return failed(
                    k,
                    PlaceError::ClaimConflict {
                        claim: key(&w.claim),
                    },
                );
            }
            // Refused: nothing of it holds. Otherwise it may have landed:
            // its devices stay taken, its outcome unknown until the watch
            // shows the claim changed (or the assumption's deadline).
            Ok(Err(e)) if e.nothing_written() => return failed(k, e.into()),
            Ok(Err(e)) => {
                outcome_unknown(view, w);
                return failed(k + 1, e.into());
            }
            Err(_) => {
                outcome_unknown(view, w);
                return failed(
                    k + 1,
                    PlaceError::ClaimTimeout {
                        claim: key(&w.claim),
                        secs: budget.as_secs(),
                    },
                );
            }
        }
    }
    binder.write(pod, &d.node, None).await?;
    Ok(())
}
