//! The parts of Kueue's API this controller reads and writes, as serde types
//! of `kueue.x-k8s.io/v1beta1` at Kueue v0.19.2
//! (`apis/kueue/v1beta1/workload_types.go`, `admissioncheck_types.go`). Only
//! the fields used are typed; the rest of an object is tolerated on reading,
//! and every write is a merge patch of the status subresource naming only the
//! fields it sets, so nothing untyped is ever written back. An admission
//! check's state entry keeps its untyped fields (`podSetUpdates`,
//! `retryCount`, `requeueAfterSeconds`) as read, since the patch replaces the
//! list whole (a JSON merge patch replaces arrays).
//!
//! The fields read here have the same names and meaning in `v1beta2` (Kueue's
//! storage version from v0.15 on, `v1beta1` deprecated but served at v0.19.2);
//! [`VERSION`] is the one place to switch.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::ObjectMeta;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version read and written.
pub const VERSION: &str = "v1beta1";
/// The Kueue release whose types these follow.
pub const KUEUE_RELEASE: &str = "v0.19.2";

/// A Kueue `Workload`: what a job asks (its podSets) and how far Kueue's
/// admission has gone.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadSpec,
    #[serde(default)]
    pub status: Option<WorkloadStatus>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
}

/// `count` pods of one template.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub count: i32,
    #[serde(default)]
    pub template: PodTemplateSpec,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Set while quota is reserved (its content is not read here).
    #[serde(default)]
    pub admission: Option<serde_json::Value>,
    #[serde(default)]
    pub admission_checks: Vec<AdmissionCheckState>,
}

/// A `metav1.Condition` as far as it is read.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One admission check's state on a workload.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckState {
    pub name: String,
    pub state: CheckState,
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default)]
    pub message: String,
    /// Whatever else the entry carries, written back as read.
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `Pending`, `Ready`, `Retry`, `Rejected` (`admissioncheck_types.go`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum CheckState {
    /// Not decided yet, or (set by its controller) to be re-evaluated: the
    /// workload keeps its quota and waits.
    #[default]
    Pending,
    /// Passed: with quota reserved and every check Ready, the workload is admitted.
    Ready,
    /// Cannot pass now: the workload is evicted (quota released), requeued,
    /// and the check set back to Pending when quota is reserved again.
    Retry,
    /// Will not pass: the workload is evicted and deactivated.
    Rejected,
    /// A state this version does not know (Kueue's CRD allows only the four
    /// above): read without failing the whole list, never written.
    #[serde(other)]
    Unknown,
}

impl CheckState {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckState::Pending => "Pending",
            CheckState::Ready => "Ready",
            CheckState::Retry => "Retry",
            CheckState::Rejected => "Rejected",
            CheckState::Unknown => "Unknown",
        }
    }
}

/// A Kueue `AdmissionCheck` (cluster-scoped): which controller answers the
/// check of that name.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheck {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AdmissionCheckSpec,
    #[serde(default)]
    pub status: Option<AdmissionCheckStatus>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckSpec {
    #[serde(default)]
    pub controller_name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl Workload {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or("default"),
            self.metadata.name.as_deref().unwrap_or("")
        )
    }

    fn condition(&self, type_: &str) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True")
        })
    }

    /// Quota is reserved in a ClusterQueue (Kueue's `HasQuotaReservation`:
    /// the condition `QuotaReserved=True`).
    pub fn has_quota_reservation(&self) -> bool {
        self.condition("QuotaReserved")
    }

    /// The workload ran to its end (`Finished=True`).
    pub fn is_finished(&self) -> bool {
        self.condition("Finished")
    }

    /// The state of check `name`, if the workload lists it.
    pub fn check(&self, name: &str) -> Option<&AdmissionCheckState> {
        self.status
            .as_ref()?
            .admission_checks
            .iter()
            .find(|c| c.name == name)
    }
}

impl kube::Resource for Workload {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Workload".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "workloads".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl kube::Resource for AdmissionCheck {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "AdmissionCheck".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "admissionchecks".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_check_entry_keeps_what_it_does_not_type_and_reads_an_unknown_state() {
        let v = json!({
            "name": "prov", "state": "Retry", "message": "Retrying after failure",
            "lastTransitionTime": "2026-12-07T10:00:00Z", "retryCount": 2,
            "requeueAfterSeconds": 60,
            "podSetUpdates": [{"name": "main", "nodeSelector": {"pool": "spot"}}]
        });
        let e: AdmissionCheckState = serde_json::from_value(v.clone()).expect("reads");
        assert_eq!(e.state, CheckState::Retry);
        // Written back whole: the patch replaces the list.
        assert_eq!(serde_json::to_value(&e).expect("writes"), v);
        let odd: AdmissionCheckState = serde_json::from_value(json!({
            "name": "x", "state": "Paused", "message": "", "lastTransitionTime": ""
        }))
        .expect("an unknown state fails no list");
        assert_eq!(odd.state, CheckState::Unknown);
    }
}
