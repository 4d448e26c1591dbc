//! The check's answer for each workload: can every pod of every podSet be
//! placed now, together?
//!
//! One decision path: each podSet's template becomes the pod one replica
//! would be ([`podset_pod`]), whose asks are read as a real pod's
//! ([`convert::pod_asks`]) and whose node constraints are standalone mode's
//! ([`node_allows`]); [`Mirror::estimate_on`] places `count` replicas one by
//! one with the placement judge on a scratch copy of the ledger. The podSets
//! of one workload are placed in sequence on the same scratch, so they must
//! fit together; workloads are judged one after another on it too, and a
//! workload found Ready keeps its pods there, so two workloads are never both
//! told Ready for the same room. Workloads told Ready earlier whose pods are
//! not all placed yet ([`Started`]) take their missing pods' room first.
//!
//! Tessera's own queue quota is not applied: Kueue reserved the workload's
//! quota before the check is asked, and its pods pass Tessera's quota gate
//! where the scheduler trusts Kueue ([`crate::mirror::Mirror::set_trust_kueue`]).
//!
//! States, as Kueue's own ProvisioningRequest controller uses them (v0.19.2,
//! `pkg/controller/admissionchecks/provisioning/controller.go`): `Ready` when
//! everything fits; `Pending` with a message while it does not fit yet (the
//! ProvisioningRequest check stays Pending while capacity is awaited; the
//! workload keeps its quota and is judged again at every change of the
//! cluster, and a MultiKueue manager takes whichever worker admits first);
//! `Rejected` when a podSet's ask cannot be read at all (it never will be).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ObjectMeta;
use tessera_core::model::Catalog;

use super::PODSET_LABEL;
use super::api::{CheckState, PodSet, Workload};
use crate::convert;
use crate::mirror::{Mirror, Scratch};
use crate::standalone::node_allows;

/// What the check says of one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub state: CheckState,
    pub message: String,
}

/// A workload told Ready whose pods may not all be placed yet.
pub struct Started<'w> {
    pub workload: &'w Workload,
}

/// The pod one replica of `ps` would be: the template's metadata and spec in
/// the workload's namespace, labelled with the podSet as Kueue labels the
/// pods of an admitted workload.
pub fn podset_pod(wl: &Workload, ps: &PodSet) -> Pod {
    let t = &ps.template;
    let mut meta: ObjectMeta = t.metadata.clone().unwrap_or_default();
    meta.namespace = Some(
        wl.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
    );
    meta.name = Some(format!(
        "{}-{}-estimate",
        wl.metadata.name.as_deref().unwrap_or("workload"),
        ps.name
    ));
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(PODSET_LABEL.into(), ps.name.clone());
    Pod {
        metadata: meta,
        spec: t.spec.clone(),
        status: None,
    }
}

/// How many pods of each podSet of `wl` the mirror holds (bound, or reserved
/// while their bind is in flight). A pod is the workload's when Kueue's
/// annotation `kueue.x-k8s.io/workload` names it, when it is one of the
/// workload's owners (plain pods and pod groups own their workload), or when
/// it shares an owner with the workload (a Job owns both its Workload and its
/// pods); the podSet is the pod's label `kueue.x-k8s.io/podset`.
fn held_by_podset(m: &Mirror, index: &PodIndex, wl: &Workload) -> BTreeMap<String, u32> {
    let ns = wl.metadata.namespace.as_deref().unwrap_or("default");
    let name = wl.metadata.name.as_deref().unwrap_or("");
    let mut uids: BTreeSet<&str> = BTreeSet::new();
    let mut keys: Vec<String> = vec![format!("{ns}\0wl\0{name}")];
    for o in wl.metadata.owner_references.iter().flatten() {
        keys.push(format!("{ns}\0uid\0{}", o.uid));
    }
    for k in &keys {
        for uid in index.get(k).into_iter().flatten() {
            uids.insert(uid);
        }
    }
    let mut out = BTreeMap::new();
    for uid in uids {
        if m.held(uid).is_none() {
            continue;
        }
        if let Some(ps) = m
            .pod(uid)
            .and_then(|p| p.metadata.labels.as_ref()?.get(PODSET_LABEL))
        {
            *out.entry(ps.clone()).or_default() += 1;
        }
    }
    out
}

/// Pods with Kueue's podSet label by the keys [`held_by_podset`] looks up.
type PodIndex = BTreeMap<String, Vec<String>>;

fn pod_index(m: &Mirror) -> PodIndex {
    let mut index: PodIndex = BTreeMap::new();
    for p in m.pods() {
        let labelled = p
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(PODSET_LABEL));
        let Some(uid) = p.metadata.uid.clone().filter(|_| labelled) else {
            continue;
        };
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let mut keys = vec![format!("{ns}\0uid\0{uid}")];
        for o in p.metadata.owner_references.iter().flatten() {
            keys.push(format!("{ns}\0uid\0{}", o.uid));
        }
        if let Some(w) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(super::WORKLOAD_ANNOTATION))
        {
            keys.push(format!("{ns}\0wl\0{w}"));
        }
        for k in keys {
            index.entry(k).or_default().push(uid.clone());
        }
    }
    index
}

/// Places `count` replicas of `ps` on `scratch`: `Ok(())` when all fit,
/// otherwise the decision saying what does not.
fn place_podset(
    m: &Mirror,
    catalog: &Catalog,
    scratch: &mut Scratch,
    wl: &Workload,
    ps: &PodSet,
    count: u32,
) -> Result<(), Decision> {
    if count == 0 {
        return Ok(());
    }
    let pod = podset_pod(wl, ps);
    let asks = convert::pod_asks(&pod, catalog);
    let rejected = |why: String| Decision {
        state: CheckState::Rejected,
        message: format!("podSet {}: {why}", ps.name),
    };
    let req = asks.request.map_err(|e| rejected(e.to_string()))?;
    let host = asks.host.map_err(rejected)?;
    let counted = m
        .estimate_on(scratch, &req, &host, |f| node_allows(&pod, f), count)
        .map_err(|e| Decision {
            state: CheckState::Pending,
            message: format!("podSet {}: the ledger refused an estimate: {e}", ps.name),
        })?;
    if counted.estimate.replicas >= count {
        return Ok(());
    }
    let why = counted
        .short
        .map_or_else(|| "no room".to_string(), |e| e.to_string());
    Err(Decision {
        state: CheckState::Pending,
        message: format!(
            "podSet {}: {} of {count} pods ({req}) fit now; for the next: {why}",
            ps.name, counted.estimate.replicas
        ),
    })
}

fn count_of(ps: &PodSet) -> u32 {
    u32::try_from(ps.count).unwrap_or(0)
}

/// Judges `pending` (workloads whose check is Pending, in the order given)
/// one after another on one scratch copy of the mirror's state, after the
/// missing pods of `started` took their room. A workload found Ready keeps its
/// pods on the scratch for the ones after it.
pub fn judge(m: &mut Mirror, started: &[Started<'_>], pending: &[&Workload]) -> Vec<Decision> {
    let mut scratch = m.scratch();
    let catalog = m.cluster().catalog.clone();
    let m: &Mirror = m;
    let index = pod_index(m);
    for s in started {
        let held = held_by_podset(m, &index, s.workload);
        for ps in &s.workload.spec.pod_sets {
            let missing = count_of(ps).saturating_sub(held.get(&ps.name).copied().unwrap_or(0));
            // Room for what fits of it; a started workload is not judged again.
            let _ = place_podset(m, &catalog, &mut scratch, s.workload, ps, missing);
        }
    }
    pending
        .iter()
        .map(|wl| {
            let mut trial = scratch.clone();
            let mut fits: Vec<String> = Vec::new();
            for ps in &wl.spec.pod_sets {
                if let Err(d) = place_podset(m, &catalog, &mut trial, wl, ps, count_of(ps)) {
                    return d;
                }
                fits.push(format!("{} × {}", count_of(ps), ps.name));
            }
            scratch = trial;
            Decision {
                state: CheckState::Ready,
                message: format!("Tessera can place every pod now: {}", fits.join(", ")),
            }
        })
        .collect()
}
