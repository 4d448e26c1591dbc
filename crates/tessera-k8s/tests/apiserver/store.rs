//! The double's storage: objects by resource and key, one global
//! resourceVersion counter (the etcd revision, shared by every kind: README
//! "Rules a test double should follow"), and a bounded history of changes that
//! serves watches from an old resourceVersion and paginated LISTs at the
//! resourceVersion of their first page (file 09). Once a change falls out of
//! the window, a watch from before it gets `ERROR 410` (file 14) and a continue
//! token from before it gets HTTP 410 with a replacement token (file 15).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use super::select::{FieldSelector, LabelSelector};
use super::status::{ApiError, expired};

/// The resources the double serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Namespaces,
    Pods,
    Nodes,
    GpuNodes,
    Leases,
    /// policy/v1 PodDisruptionBudgets: stored, listed, and consulted by the
    /// eviction subresource as the API server does ([`super::pods::evict`]).
    PodDisruptionBudgets,
    /// core/v1 events.
    CoreEvents,
    /// events.k8s.io/v1 events (a real server shares storage with core/v1; the
    /// double keeps them apart, which the scheduler cannot observe).
    Events,
    /// resource.k8s.io/v1 ResourceClaims (namespaced; a `status` subresource),
    /// ResourceSlices and DeviceClasses (cluster-scoped). Kubernetes v1.34+
    /// DRA responses are not recorded in ../shared/fixtures (v1.28 has no
    /// resource.k8s.io/v1): their shapes follow the upstream types
    /// (`k8s.io/api/resource/v1/types.go`, protocols.md §3) and the generic
    /// rules recorded for other kinds (409 Conflict on a stale
    /// resourceVersion, merge-patch semantics). See [`super::dra`].
    Claims,
    Slices,
    DeviceClasses,
    /// scheduling.k8s.io/v1 PriorityClasses (cluster-scoped), which the
    /// Priority admission plugin resolves on pod create ([`super::pods::admit_priority`]).
    PriorityClasses,
    /// kueue.x-k8s.io/v1beta1 Workloads (namespaced) and AdmissionChecks
    /// (cluster-scoped), custom resources with a `status` subresource: see
    /// [`super::kueue`].
    Workloads,
    AdmissionChecks,
}

impl Resource {
    pub fn from_path(group: &str, version: &str, plural: &str) -> Option<Resource> {
        Some(match (group, version, plural) {
            ("", "v1", "namespaces") => Resource::Namespaces,
            ("", "v1", "pods") => Resource::Pods,
            ("", "v1", "nodes") => Resource::Nodes,
            ("", "v1", "events") => Resource::CoreEvents,
            ("tessera.io", "v1alpha1", "gpunodes") => Resource::GpuNodes,
            ("coordination.k8s.io", "v1", "leases") => Resource::Leases,
            ("policy", "v1", "poddisruptionbudgets") => Resource::PodDisruptionBudgets,
            ("events.k8s.io", "v1", "events") => Resource::Events,
            ("resource.k8s.io", "v1", "resourceclaims") => Resource::Claims,
            ("resource.k8s.io", "v1", "resourceslices") => Resource::Slices,
            ("resource.k8s.io", "v1", "deviceclasses") => Resource::DeviceClasses,
            ("scheduling.k8s.io", "v1", "priorityclasses") => Resource::PriorityClasses,
            ("kueue.x-k8s.io", "v1beta1", "workloads") => Resource::Workloads,
            ("kueue.x-k8s.io", "v1beta1", "admissionchecks") => Resource::AdmissionChecks,
            _ => return None,
        })
    }

    pub fn plural(self) -> &'static str {
        match self {
            Resource::Namespaces => "namespaces",
            Resource::Pods => "pods",
            Resource::Nodes => "nodes",
            Resource::GpuNodes => "gpunodes",
            Resource::Leases => "leases",
            Resource::PodDisruptionBudgets => "poddisruptionbudgets",
            Resource::CoreEvents | Resource::Events => "events",
            Resource::Claims => "resourceclaims",
            Resource::Slices => "resourceslices",
            Resource::DeviceClasses => "deviceclasses",
            Resource::PriorityClasses => "priorityclasses",
            Resource::Workloads => "workloads",
            Resource::AdmissionChecks => "admissionchecks",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Resource::GpuNodes => "tessera.io",
            Resource::Leases => "coordination.k8s.io",
            Resource::PodDisruptionBudgets => "policy",
            Resource::Events => "events.k8s.io",
            Resource::Claims | Resource::Slices | Resource::DeviceClasses => "resource.k8s.io",
            Resource::PriorityClasses => "scheduling.k8s.io",
            Resource::Workloads | Resource::AdmissionChecks => "kueue.x-k8s.io",
            _ => "",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Namespaces => "Namespace",
            Resource::Pods => "Pod",
            Resource::Nodes => "Node",
            Resource::GpuNodes => "GpuNode",
            Resource::Leases => "Lease",
            Resource::PodDisruptionBudgets => "PodDisruptionBudget",
            Resource::CoreEvents | Resource::Events => "Event",
            Resource::Claims => "ResourceClaim",
            Resource::Slices => "ResourceSlice",
            Resource::DeviceClasses => "DeviceClass",
            Resource::PriorityClasses => "PriorityClass",
            Resource::Workloads => "Workload",
            Resource::AdmissionChecks => "AdmissionCheck",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Resource::GpuNodes => "tessera.io/v1alpha1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::PodDisruptionBudgets => "policy/v1",
            Resource::Events => "events.k8s.io/v1",
            Resource::Claims | Resource::Slices | Resource::DeviceClasses => "resource.k8s.io/v1",
            Resource::PriorityClasses => "scheduling.k8s.io/v1",
            Resource::Workloads | Resource::AdmissionChecks => "kueue.x-k8s.io/v1beta1",
            _ => "v1",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Resource::Namespaces
                | Resource::Nodes
                | Resource::GpuNodes
                | Resource::Slices
                | Resource::DeviceClasses
                | Resource::PriorityClasses
                | Resource::AdmissionChecks
        )
    }

    /// `pods`, `leases.coordination.k8s.io`: how messages name the resource.
    pub fn qualified(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// Whether changes are kept for watches (events are write-only here).
    fn watched(self) -> bool {
        !matches!(self, Resource::CoreEvents | Resource::Events)
    }
}

/// Namespace ("" for cluster-scoped) and name.
pub type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change. For `Deleted`, `old` is the last stored state and
/// `new` the same object stamped with the deletion's resourceVersion.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub kind: ChangeKind,
    pub old: Option<Arc<Value>>,
    pub new: Arc<Value>,
}

/// What a watch or a list selects.
#[derive(Debug, Clone)]
pub struct Filter {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(self.resource, obj)
    }
}

struct Watcher {
    filter: Filter,
    tx: UnboundedSender<String>,
}

pub fn key_of(obj: &Value) -> Key {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

pub fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

pub fn rv_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

/// One line of a watch stream.
pub fn event_line(type_: &str, obj: &Value) -> String {
    let mut s = serde_json::to_string(&json!({"type": type_, "object": obj})).unwrap_or_default();
    s.push('\n');
    s
}

/// The watch event `filter` sees for `change`, if any (file 08, watch B: an
/// object leaving the selector is `DELETED` with its old state and the new rv).
fn event_for(filter: &Filter, c: &Change) -> Option<String> {
    if c.resource != filter.resource {
        return None;
    }
    match c.kind {
        ChangeKind::Added => filter.matches(&c.new).then(|| event_line("ADDED", &c.new)),
        ChangeKind::Deleted => c
            .old
            .as_ref()
            .filter(|o| filter.matches(o))
            .map(|_| event_line("DELETED", &c.new)),
        ChangeKind::Modified => {
            let was = c.old.as_ref().is_some_and(|o| filter.matches(o));
            let is = filter.matches(&c.new);
            match (was, is) {
                (false, true) => Some(event_line("ADDED", &c.new)),
                (true, true) => Some(event_line("MODIFIED", &c.new)),
                (true, false) => {
                    let mut gone = c.old.as_deref().cloned().unwrap_or(Value::Null);
                    set_rv(&mut gone, c.rv);
                    Some(event_line("DELETED", &gone))
                }
                (false, false) => None,
            }
        }
    }
}

/// Where a watch starts.
pub enum WatchFrom {
    /// No resourceVersion or `0`: synthetic ADDED for every match, then live (file 18).
    Now,
    /// Replay changes after this resourceVersion, then live (files 08, 14).
    After(u64),
}

/// All stored objects and the change history.
pub struct Store {
    pub rv: u64,
    objects: BTreeMap<Resource, BTreeMap<Key, Arc<Value>>>,
    history: VecDeque<Change>,
    /// Changes kept for watches and paginated lists.
    pub window: usize,
    /// Every change after this resourceVersion is still in `history`.
    compacted: u64,
    watchers: Vec<Watcher>,
}

impl Store {
    pub fn new(window: usize, start_rv: u64) -> Store {
        Store {
            rv: start_rv,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            window: window.max(1),
            compacted: start_rv,
            watchers: Vec::new(),
        }
    }

    pub fn get(&self, r: Resource, key: &Key) -> Option<&Arc<Value>> {
        self.objects.get(&r).and_then(|m| m.get(key))
    }

    pub fn all(&self, r: Resource) -> impl Iterator<Item = &Arc<Value>> {
        self.objects.get(&r).into_iter().flat_map(|m| m.values())
    }

    fn commit(&mut self, change: Change) {
        if !change.resource.watched() {
            return;
        }
        self.watchers
            .retain(|w| match event_for(&w.filter, &change) {
                Some(line) => w.tx.send(line).is_ok(),
                None => !w.tx.is_closed(),
            });
        self.history.push_back(change);
        while self.history.len() > self.window {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
    }

    /// Stores a new object with the next resourceVersion.
    pub fn create(&mut self, r: Resource, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let obj = Arc::new(obj);
        self.objects
            .entry(r)
            .or_default()
            .insert(key_of(&obj), obj.clone());
        self.commit(Change {
            rv: self.rv,
            resource: r,
            kind: ChangeKind::Added,
            old: None,
            new: obj.clone(),
        });
        obj
    }

    /// Replaces a stored object with the next resourceVersion.
    pub fn update(&mut self, r: Resource, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let obj = Arc::new(obj);
        let old = self
            .objects
            .entry(r)
            .or_default()
            .insert(key_of(&obj), obj.clone());
        self.commit(Change {
            rv: self.rv,
            resource: r,
            kind: ChangeKind::Modified,
            old,
            new: obj.clone(),
        });
        obj
    }

    /// Removes an object; the returned state carries the deletion's resourceVersion.
    pub fn delete(&mut self, r: Resource, key: &Key) -> Option<Arc<Value>> {
        let old = self.objects.get_mut(&r)?.remove(key)?;
        self.rv += 1;
        let mut gone = (*old).clone();
        set_rv(&mut gone, self.rv);
        let gone = Arc::new(gone);
        self.commit(Change {
            rv: self.rv,
            resource: r,
            kind: ChangeKind::Deleted,
            old: Some(old),
            new: gone.clone(),
        });
        Some(gone)
    }

    /// Forgets the whole history, as if every watch cache window had passed:
    /// any older resourceVersion is now expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// The objects of `filter` as they were at resourceVersion `at` (sorted by
    /// key), rebuilt by undoing later changes; `None` when `at` is too old.
    pub fn snapshot(&self, filter: &Filter, at: u64) -> Option<Vec<Arc<Value>>> {
        if at < self.compacted {
            return None;
        }
        let mut objs: BTreeMap<Key, Arc<Value>> = self
            .objects
            .get(&filter.resource)
            .cloned()
            .unwrap_or_default();
        for c in self.history.iter().rev().take_while(|c| c.rv > at) {
            if c.resource != filter.resource {
                continue;
            }
            let key = key_of(&c.new);
            match (c.kind, &c.old) {
                (ChangeKind::Added, _) => {
                    objs.remove(&key);
                }
                (_, Some(old)) => {
                    objs.insert(key, old.clone());
                }
                (_, None) => {}
            }
        }
        Some(objs.into_values().filter(|o| filter.matches(o)).collect())
    }

    /// Registers a watch. The backlog is sent before any later change can be,
    /// since both happen under the caller's lock.
    pub fn watch(
        &mut self,
        filter: Filter,
        from: WatchFrom,
        tx: UnboundedSender<String>,
    ) -> Result<(), ApiError> {
        match from {
            WatchFrom::Now => {
                for o in self.all(filter.resource).filter(|o| filter.matches(o)) {
                    let _ = tx.send(event_line("ADDED", o));
                }
            }
            WatchFrom::After(rv) => {
                if rv < self.compacted {
                    return Err(expired(
                        &format!("too old resource version: {rv} ({})", self.compacted + 1),
                        None,
                    ));
                }
                for c in self.history.iter().filter(|c| c.rv > rv) {
                    if let Some(line) = event_for(&filter, c) {
                        let _ = tx.send(line);
                    }
                }
            }
        }
        self.watchers.push(Watcher { filter, tx });
        Ok(())
    }

    pub fn watchers(&self) -> usize {
        self.watchers.iter().filter(|w| !w.tx.is_closed()).count()
    }
}
