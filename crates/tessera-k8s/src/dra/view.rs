//! What the scheduler knows of DRA objects: the watched ResourceClaims,
//! ResourceSlices and DeviceClasses, and the claims it wrote that the watch has
//! not shown yet ([`super::overlay`]). Pure state; the watchers that feed it
//! are in [`super::watch`].
//!
//! Objects arrive as JSON and are read into [`super::types`]; one that does
//! not read is kept as an error under its name (a pod using that claim is told
//! why) and never panics or hides the others. Nodes' inventories are built
//! from the slices when a decision needs them, and rebuilt only after a slice
//! changed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::time::Instant;

use super::DRIVER;
use super::inventory::{DeviceKey, Hold, Holdings, NodeInventory, claims_holdings, node_inventory};
use super::overlay::Overlay;
use super::types::{DeviceClass, ResourceClaim, ResourceSlice};

type Key = (String, String);

fn key_of(v: &Value) -> Key {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default();
    (
        s("/metadata/namespace").to_string(),
        s("/metadata/name").to_string(),
    )
}

/// Reads one object; `Err` says why it does not read.
fn read<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// The devices a claim's raw `status.allocation.devices.results` names, read
/// field by field (for a claim that does not read as a whole).
fn allocated_devices(v: &Value) -> Vec<DeviceKey> {
    let Some(results) = v
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    results
        .iter()
        .filter(|r| r.get("adminAccess").and_then(Value::as_bool) != Some(true))
        .filter_map(|r| {
            let s = |f: &str| r.get(f).and_then(Value::as_str).map(str::to_string);
            Some(DeviceKey {
                driver: s("driver")?,
                pool: s("pool")?,
                device: s("device")?,
            })
        })
        .collect()
}

static EMPTY: BTreeMap<String, NodeInventory> = BTreeMap::new();

/// The DRA objects as last listed and watched.
#[derive(Debug, Default)]
pub struct DraView {
    claims: BTreeMap<Key, Result<ResourceClaim, String>>,
    slices: BTreeMap<String, ResourceSlice>,
    classes: BTreeMap<String, DeviceClass>,
    /// Slices and classes that did not read, by name.
    unread: BTreeMap<String, String>,
    overlay: Overlay,
    /// Per claim that does not read, the devices its raw allocation names:
    /// held whole until it reads or goes (issue 41, defect 6).
    unread_holds: BTreeMap<Key, Vec<DeviceKey>>,
    /// How many times a claim's devices were given back (a claim deleted,
    /// deallocated or released by a consumer, or a relist): room freed.
    released: u64,
    /// Per node, built from our driver's slices; `None` after a slice changed.
    inventories: Option<BTreeMap<String, NodeInventory>>,
}

impl DraView {
    // ---- watch input -------------------------------------------------------------------

    pub fn replace_claims(&mut self, items: Vec<Value>) {
        self.released += 1;
        self.claims.clear();
        self.unread_holds.clear();
        let listed: std::collections::BTreeSet<String> = items
            .iter()
            .filter_map(|v| v.pointer("/metadata/uid").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        // A claim deleted while the watch was down: its writes are gone with it.
        self.overlay.retain_listed(&listed);
        for v in items {
            self.upsert_claim(v);
        }
    }

    pub fn upsert_claim(&mut self, v: Value) {
        let key = key_of(&v);
        let named = allocated_devices(&v);
        let claim = read::<ResourceClaim>(v);
        if claim.is_err() && !named.is_empty() {
            self.unread_holds.insert(key.clone(), named);
        } else {
            self.unread_holds.remove(&key);
        }
        let held = |c: &ResourceClaim| {
            c.status.as_ref().map_or((0, 0), |s| {
                (usize::from(s.allocation.is_some()), s.reserved_for.len())
            })
        };
        if let (Some(Ok(old)), Ok(new)) = (self.claims.get(&key), &claim) {
            let (was, now) = (held(old), held(new));
            if now.0 < was.0 || now.1 < was.1 {
                self.released += 1;
            }
        }
        if let Ok(c) = &claim {
            self.overlay.observe(
                c.metadata.uid.as_deref().unwrap_or_default(),
                c.metadata.resource_version.as_deref(),
            );
        }
        self.claims.insert(key, claim);
    }

    pub fn remove_claim(&mut self, v: &Value) {
        if let Some(uid) = v.pointer("/metadata/uid").and_then(Value::as_str) {
            self.overlay.forget(uid);
        }
        self.claims.remove(&key_of(v));
        self.unread_holds.remove(&key_of(v));
        self.released += 1;
    }

    pub fn replace_slices(&mut self, items: Vec<Value>) {
        self.slices.clear();
        self.unread.retain(|k, _| !k.starts_with("resourceslice "));
        for v in items {
            self.upsert_slice(v);
        }
        self.inventories = None;
    }

    pub fn upsert_slice(&mut self, v: Value) {
        let name = key_of(&v).1;
        match read::<ResourceSlice>(v) {
            Ok(s) => {
                self.unread.remove(&format!("resourceslice {name}"));
                self.slices.insert(name, s);
            }
            Err(e) => {
                self.slices.remove(&name);
                self.unread.insert(format!("resourceslice {name}"), e);
            }
        }
        self.inventories = None;
    }

    pub fn remove_slice(&mut self, v: &Value) {
        let name = key_of(v).1;
        self.slices.remove(&name);
        self.unread.remove(&format!("resourceslice {name}"));
        self.inventories = None;
    }

    pub fn replace_classes(&mut self, items: Vec<Value>) {
        self.classes.clear();
        self.unread.retain(|k, _| !k.starts_with("deviceclass "));
        for v in items {
            self.upsert_class(v);
        }
    }

    pub fn upsert_class(&mut self, v: Value) {
        let name = key_of(&v).1;
        match read::<DeviceClass>(v) {
            Ok(c) => {
                self.unread.remove(&format!("deviceclass {name}"));
                self.classes.insert(name, c);
            }
            Err(e) => {
                self.classes.remove(&name);
                self.unread.insert(format!("deviceclass {name}"), e);
            }
        }
    }

    pub fn remove_class(&mut self, v: &Value) {
        let name = key_of(v).1;
        self.classes.remove(&name);
        self.unread.remove(&format!("deviceclass {name}"));
    }

    // ---- this scheduler's writes -------------------------------------------------------

    /// A decided allocation, before its write (`claim` as it will be).
    pub fn assume(&mut self, claim: ResourceClaim, now: Instant) {
        self.overlay.assume(claim, now);
    }

    /// The claim was updated on its way to being written (its delete
    /// protection added): what is assumed of it is now at that version, so a
    /// write of unknown outcome ends only once the claim changes past it.
    pub fn rebase(&mut self, claim: &ResourceClaim) {
        self.overlay.rebase(
            claim.metadata.uid.as_deref().unwrap_or_default(),
            claim.metadata.resource_version.as_deref(),
        );
    }

    /// The server's answer to a write of ours.
    pub fn written(&mut self, claim: ResourceClaim, now: Instant) {
        let seen = self.watched_rv(&claim);
        self.overlay.written(claim, seen.as_deref(), now);
    }

    /// A write of ours failed in a way that may have landed: its devices stay
    /// assumed taken, but the claim is not to be taken as written
    /// ([`DraView::outcome_unknown`]) until the watch shows it changed.
    pub fn unknown(&mut self, claim: &ResourceClaim) {
        let seen = self.watched_rv(claim);
        self.overlay.unknown(
            claim.metadata.uid.as_deref().unwrap_or_default(),
            seen.as_deref(),
        );
    }

    /// Whether a write of ours to the claim of `claim_uid` failed with its
    /// outcome unknown, not yet settled by the watch.
    pub fn outcome_unknown(&self, claim_uid: &str) -> bool {
        self.overlay.is_unknown(claim_uid)
    }

    /// `claim` as the watch shows it, without what this scheduler assumed,
    /// if the watch has it (the same UID).
    pub fn watched(&self, claim: &ResourceClaim) -> Option<&ResourceClaim> {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        match self.claims.get(&key) {
            Some(Ok(c)) if c.metadata.uid == claim.metadata.uid => Some(c),
            _ => None,
        }
    }

    fn watched_rv(&self, claim: &ResourceClaim) -> Option<String> {
        self.watched(claim)
            .and_then(|c| c.metadata.resource_version.clone())
    }

    /// A write of ours was refused: its claim is as the watch shows it.
    pub fn forget(&mut self, claim_uid: &str) {
        self.overlay.forget(claim_uid);
    }

    /// Drops assumed claims past their deadline.
    pub fn expire(&mut self, now: Instant) {
        let n = self.overlay.expire(now);
        if n > 0 {
            tracing::warn!(
                claims = n,
                "claim allocations this scheduler was writing (no confirmed answer) were not shown by the watch before their deadline; the watch is taken as the truth again"
            );
        }
    }

    // ---- reads -------------------------------------------------------------------------

    /// Claim `namespace/name` as this scheduler sees it: its own write when
    /// the watch has not shown it yet; `Err` when the watched object does not read.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Result<&ResourceClaim, &str>> {
        let got = self
            .claims
            .get(&(namespace.to_string(), name.to_string()))?;
        Some(match got {
            Ok(c) => Ok(c
                .metadata
                .uid
                .as_deref()
                .and_then(|u| self.overlay.get(u))
                .unwrap_or(c)),
            Err(e) => Err(e.as_str()),
        })
    }

    /// Every readable claim as [`DraView::claim`] sees it.
    pub fn claims(&self) -> impl Iterator<Item = &ResourceClaim> {
        self.claims
            .values()
            .filter_map(|c| c.as_ref().ok())
            .map(|c| {
                c.metadata
                    .uid
                    .as_deref()
                    .and_then(|u| self.overlay.get(u))
                    .unwrap_or(c)
            })
    }

    /// What every claim holds (the overlay's writes included).
    pub fn usage(&self) -> Holdings {
        let mut u = claims_holdings(self.claims(), None);
        for (claim, keys) in &self.unread_holds {
            for key in keys {
                u.hold(
                    &format!("unreadable claim {claim:?}"),
                    key.clone(),
                    Hold::Unverifiable,
                );
            }
        }
        u
    }

    pub fn classes(&self) -> Vec<DeviceClass> {
        self.classes.values().cloned().collect()
    }

    /// Node `node`'s devices of our driver (other drivers' slices are not read:
    /// their devices are never ours to allocate).
    pub fn inventory(&mut self, node: &str) -> Option<&NodeInventory> {
        if self.inventories.is_none() {
            let ours: Vec<ResourceSlice> = self
                .slices
                .values()
                .filter(|s| s.spec.driver == DRIVER)
                .cloned()
                .collect();
            let mut nodes: Vec<&str> = ours
                .iter()
                .filter_map(|s| s.spec.node_name.as_deref())
                .collect();
            nodes.sort_unstable();
            nodes.dedup();
            let built = nodes
                .iter()
                .map(|n| (n.to_string(), node_inventory(n, &ours)))
                .collect();
            self.inventories = Some(built);
        }
        self.inventories.as_ref().and_then(|m| m.get(node))
    }

    /// Inventories of every node with our slices (built if needed).
    pub fn inventories(&mut self) -> &BTreeMap<String, NodeInventory> {
        let _ = self.inventory("");
        self.inventories.get_or_insert_default()
    }

    /// Every readable claim (as [`DraView::claims`]) with the inventories
    /// (built if needed), for what claims count against quotas.
    pub fn claims_and_inventories(
        &mut self,
    ) -> (Vec<&ResourceClaim>, &BTreeMap<String, NodeInventory>) {
        let _ = self.inventory("");
        let this = &*self;
        let inventories = this.inventories.as_ref().map_or(&EMPTY, |m| m);
        (this.claims().collect(), inventories)
    }

    /// Objects that did not read, and devices left out of inventories (so
    /// `&mut`: the inventories are built if a slice changed).
    pub fn problems(&mut self) -> Vec<String> {
        let mut v: Vec<String> = self
            .claims
            .iter()
            .filter_map(|((ns, n), c)| {
                c.as_ref()
                    .err()
                    .map(|e| format!("resourceclaim {ns}/{n}: {e}"))
            })
            .collect();
        v.extend(self.unread.iter().map(|(k, e)| format!("{k}: {e}")));
        let skipped: Vec<String> = self
            .inventories()
            .iter()
            .flat_map(|(node, inv)| inv.skipped.iter().map(move |s| format!("node {node}: {s}")))
            .collect();
        v.extend(skipped);
        v
    }

    /// How many times claims gave devices back (see the field).
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Claims assumed and not yet shown by the watch.
    pub fn assumed(&self) -> usize {
        self.overlay.len()
    }
}

/// The one view a process shares between its watchers and the standalone loop.
/// Lock order: the mirror first, then this.
#[derive(Debug, Clone, Default)]
pub struct SharedDraView(Arc<Mutex<DraView>>);

impl SharedDraView {
    pub fn new() -> SharedDraView {
        SharedDraView::default()
    }

    /// Locks the view; a poisoned lock is taken as it is (every mutation
    /// leaves the maps consistent).
    pub fn lock(&self) -> MutexGuard<'_, DraView> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Issue 41, defect 6: a claim that does not read but whose allocation
    /// names a device counted as nothing; it now holds that device whole
    /// until it reads or goes.
    #[test]
    fn an_unreadable_allocated_claim_holds_its_devices() {
        let mut v = DraView::default();
        let bad = json!({"metadata": {"name": "bad", "namespace": "ml", "uid": "b"},
            "spec": {"devices": {"requests": "not a list"}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "g", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]}}}});
        v.replace_claims(vec![bad.clone()]);
        let key = DeviceKey {
            driver: DRIVER.into(),
            pool: "n1".into(),
            device: "gpu-0".into(),
        };
        let u = v.usage();
        assert!(
            u.devices
                .get(&key)
                .is_some_and(|d| !d.is_free() && d.exclusive == 1),
            "{u:?}"
        );
        v.remove_claim(&bad);
        assert!(v.usage().devices.is_empty());
        v.upsert_claim(bad);
        assert!(!v.usage().devices.is_empty());
        v.replace_claims(vec![]);
        assert!(v.usage().devices.is_empty());
    }

    /// A claim or slice that does not read is named, never a panic, and
    /// hides nothing else.
    #[test]
    fn bad_objects_are_named_and_hide_nothing_else() {
        let mut v = DraView::default();
        v.replace_claims(vec![
            json!({"metadata": {"name": "bad", "namespace": "ml", "uid": "b"},
                "spec": {"devices": {"requests": "not a list"}}}),
            json!({"metadata": {"name": "good", "namespace": "ml", "uid": "g"}}),
        ]);
        v.replace_slices(vec![
            json!({"metadata": {"name": "s-bad"}, "spec": {"driver": 7}}),
            json!({"metadata": {"name": "s-good"}, "spec": {"driver": DRIVER, "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"},
                    {"name": "gpu-1", "attributes": {"type": {"string": "gpu", "int": 1}}}]}}),
        ]);
        assert!(matches!(v.claim("ml", "bad"), Some(Err(e)) if e.contains("invalid type")));
        assert!(matches!(v.claim("ml", "good"), Some(Ok(_))));
        assert_eq!(v.claims().count(), 1);
        assert_eq!(v.inventory("n1").map(|i| i.devices.len()), Some(1));
        let problems = v.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("resourceclaim ml/bad:"))
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("resourceslice s-bad:"))
        );
        // The device that does not read is left out, and named.
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("node n1: gpu.tessera.io/n1/gpu-1:")),
            "{problems:?}"
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
        // A pod using the bad claim is told which and why.
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "pu"},
            "spec": {"containers": [], "resourceClaims": [{"name": "e", "resourceClaimName": "bad"}]}
        }))
        .unwrap();
        match super::super::pod::pod_claims(&pod, |ns, n| v.claim(ns, n), &[]) {
            Err(super::super::pod::NotReady::Refuse(m)) => {
                assert!(m.contains("ResourceClaim ml/bad does not read"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
}
