//! `kueue.x-k8s.io/v1beta1` Workloads and AdmissionChecks in the double:
//! custom resources whose CRDs (Kueue v0.19.2, `config/components/crd/bases`)
//! declare a `status` subresource.
//!
//! Not recorded in ../shared/fixtures (no CRDs there). The rules copy
//! apiextensions-apiserver's `pkg/registry/customresource/strategy.go` as far
//! as a controller can observe them: a create drops `status`; a write to
//! `/status` changes only
//! `status` (the rest of the object stays as stored), a write to the main
//! resource never changes `status`. The resourceVersion precondition (409
//! with the recorded Conflict Status, files 05 and 07) and merge-patch
//! semantics (a list in the patch replaces the stored list) are the generic
//! ones of [`super::update`] and [`super::patch`], which the API server
//! applies to custom resources too.

use serde_json::{Value, json};

/// The strategy's PrepareForCreate: `status` is dropped (only the status
/// subresource writes it) and `metadata.generation` starts at 1.
pub fn prepare_create(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
    obj["metadata"]["generation"] = json!(1);
}

/// The status strategy's and the main strategy's PrepareForUpdate.
pub fn prepare_update(old: &Value, new: &mut Value, sub: Option<&str>) {
    if sub == Some("status") {
        let status = new.get("status").cloned();
        let meta_rv = new.pointer("/metadata/resourceVersion").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        if let Some(rv) = meta_rv {
            new["metadata"]["resourceVersion"] = rv;
        }
    } else {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
}
