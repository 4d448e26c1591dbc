//! The watchers that feed a [`SharedDraView`]: ResourceClaims (all namespaces),
//! ResourceSlices and DeviceClasses of `resource.k8s.io/v1`, each marking its
//! kind in the sync gate at its first complete list. The I/O half of
//! [`super::view`].
//!
//! The objects are watched as `DynamicObject`s (the workspace's `k8s-openapi`
//! has no `resource.k8s.io/v1`) and read into [`super::types`] by the view.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::view::{DraView, SharedDraView};
use crate::gate::{Kind, SyncGate};

/// A kind of `resource.k8s.io/v1`.
pub(crate) fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: super::types::GROUP.into(),
        version: "v1".into(),
        api_version: super::types::API_VERSION.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// `resourceslices` of `resource.k8s.io/v1`.
pub fn slices_resource() -> ApiResource {
    resource("ResourceSlice", "resourceslices")
}

/// `deviceclasses` of `resource.k8s.io/v1`.
pub fn classes_resource() -> ApiResource {
    resource("DeviceClass", "deviceclasses")
}

/// Whether the API server serves `resource.k8s.io/v1` ResourceClaims: false
/// on a 404 (Kubernetes before 1.34, or the API turned off), and the reason.
/// Any other answer leaves the watch to retry.
pub async fn served(client: &kube::Client) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &super::write::claims_resource());
    match api.list(&ListParams::default().limit(1)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Err(format!(
            "the API server does not serve {}: {}",
            super::types::API_VERSION,
            e.message
        )),
        _ => Ok(()),
    }
}

/// One change, as JSON.
enum Change {
    Replace(Vec<Value>),
    Upsert(Value),
    Delete(Value),
}

fn json(o: DynamicObject) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
    // Managed fields are large and never read.
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

async fn feed(
    api: Api<DynamicObject>,
    view: SharedDraView,
    wake: Arc<Notify>,
    gate: (SyncGate, Kind),
    apply: fn(&mut DraView, Change),
) {
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Vec<Value> = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(o)) => buffer.push(json(o)),
            Ok(Event::InitDone) => {
                apply(
                    &mut view.lock(),
                    Change::Replace(std::mem::take(&mut buffer)),
                );
                gate.0.mark(gate.1);
                wake.notify_one();
            }
            Ok(Event::Apply(o)) => {
                apply(&mut view.lock(), Change::Upsert(json(o)));
                wake.notify_one();
            }
            Ok(Event::Delete(o)) => {
                apply(&mut view.lock(), Change::Delete(json(o)));
                wake.notify_one();
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = gate.1.name(), "DRA watch failed; retrying")
            }
        }
    }
}

/// Spawns the three watchers on `tasks`.
pub fn spawn(
    tasks: &mut JoinSet<()>,
    client: &kube::Client,
    view: SharedDraView,
    wake: Arc<Notify>,
    gate: SyncGate,
) {
    tasks.spawn(feed(
        Api::all_with(client.clone(), &super::write::claims_resource()),
        view.clone(),
        wake.clone(),
        (gate.clone(), Kind::ResourceClaims),
        |v, c| match c {
            Change::Replace(items) => v.replace_claims(items),
            Change::Upsert(o) => v.upsert_claim(o),
            Change::Delete(o) => v.remove_claim(&o),
        },
    ));
    tasks.spawn(feed(
        Api::all_with(client.clone(), &slices_resource()),
        view.clone(),
        wake.clone(),
        (gate.clone(), Kind::ResourceSlices),
        |v, c| match c {
            Change::Replace(items) => v.replace_slices(items),
            Change::Upsert(o) => v.upsert_slice(o),
            Change::Delete(o) => v.remove_slice(&o),
        },
    ));
    tasks.spawn(feed(
        Api::all_with(client.clone(), &classes_resource()),
        view,
        wake,
        (gate, Kind::DeviceClasses),
        |v, c| match c {
            Change::Replace(items) => v.replace_classes(items),
            Change::Upsert(o) => v.upsert_class(o),
            Change::Delete(o) => v.remove_class(&o),
        },
    ));
}
