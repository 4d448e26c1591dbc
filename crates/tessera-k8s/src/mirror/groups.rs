//! Gangs in the mirror: `PodGroup` objects (scheduler-plugins' coscheduling
//! API) and how many members of each the mirror holds (bound or reserved).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use tessera_api::{POD_GROUP_LABEL, PodGroup, PodGroupSpec};

use super::Mirror;

/// The gang a pod belongs to: `namespace/name` of its `PodGroup`.
pub fn gang_of(pod: &Pod) -> Option<String> {
    let name = pod.metadata.labels.as_ref()?.get(POD_GROUP_LABEL)?;
    if name.is_empty() {
        return None;
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!("{ns}/{name}"))
}

fn key_of(pg: &PodGroup) -> Option<String> {
    let name = pg.metadata.name.as_deref()?;
    let ns = pg.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!("{ns}/{name}"))
}

impl Mirror {
    pub fn replace_pod_groups(&mut self, items: impl IntoIterator<Item = PodGroup>) {
        self.groups = items
            .into_iter()
            .filter_map(|g| key_of(&g).map(|k| (k, g.spec)))
            .collect::<BTreeMap<_, _>>();
    }

    pub fn upsert_pod_group(&mut self, pg: PodGroup) {
        if let Some(k) = key_of(&pg) {
            self.groups.insert(k, pg.spec);
        }
    }

    pub fn remove_pod_group(&mut self, pg: &PodGroup) {
        if let Some(k) = key_of(pg) {
            self.groups.remove(&k);
        }
    }

    /// The `PodGroup` `namespace/name`, if it exists.
    pub fn pod_group(&self, key: &str) -> Option<&PodGroupSpec> {
        self.groups.get(key)
    }

    /// Members of gang `key` the mirror holds: bound, or reserved while their bind is in flight.
    pub fn gang_held(&self, key: &str) -> usize {
        self.held
            .keys()
            .filter_map(|uid| self.pods.get(uid))
            .filter(|p| gang_of(p).as_deref() == Some(key))
            .count()
    }
}
