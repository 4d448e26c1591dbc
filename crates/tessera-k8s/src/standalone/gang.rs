//! Gangs in standalone mode: all or nothing, at least the `PodGroup`'s `minMember`.

use k8s_openapi::api::core::v1::Pod;

use super::{Decided, Standalone, decide_locked};
use crate::convert;

impl Standalone {
    /// Places gang `key` (`namespace/name` of its `PodGroup`) all or nothing:
    /// every waiting member is decided and held under one lock, largest first;
    /// unless at least `minMember` members (counting those already placed) are
    /// then held, every hold of this attempt is dropped before the lock is
    /// released and each member gets an event saying why. A waiting gang holds
    /// nothing, so two gangs can never deadlock holding half each.
    pub(super) fn attempt_gang(&mut self, key: &str, mut members: Vec<Pod>) {
        let mut m = self.mirror.lock();
        let Some(spec) = m.pod_group(key).cloned() else {
            drop(m);
            let why = format!(
                "waits for PodGroup {key}, which does not exist (scheduling.x-k8s.io/v1alpha1, the scheduler-plugins CRD)"
            );
            for p in &members {
                self.failed(p, why.clone(), "gang".into());
            }
            return;
        };
        let min = usize::try_from(spec.min_member.unwrap_or(1).max(1)).unwrap_or(1);
        let held = m.gang_held(key);
        let need = min.saturating_sub(held);
        if members.len() < need {
            drop(m);
            let why = format!(
                "gang {key}: {} of its {min} members exist ({held} placed, {} waiting); waiting for the rest",
                held + members.len(),
                members.len()
            );
            for p in &members {
                self.failed(p, why.clone(), "gang incomplete".into());
            }
            return;
        }
        let catalog = m.cluster().catalog.clone();
        let size = |p: &Pod| {
            convert::pod_request(p, &catalog).map_or(0, |r| {
                r.gpu.total_milli().max(u64::from(r.gpu.gpu_count()) * 1000)
            })
        };
        members.sort_by_key(|p| (std::cmp::Reverse(size(p)), convert::pod_key(p)));
        let mut placed: Vec<(Pod, Decided)> = Vec::new();
        let mut refused: Vec<(Pod, String, String)> = Vec::new();
        for p in members {
            match decide_locked(&mut m, &self.metrics, &p) {
                Ok(d) => placed.push((p, d)),
                Err((message, reason)) => refused.push((p, message, reason)),
            }
        }
        if placed.len() < need {
            for (p, _) in &placed {
                m.unreserve(convert::pod_uid(p));
            }
            drop(m);
            let (first, msg, _) = &refused[0];
            let why = format!(
                "gang {key} does not fit ({} of the {need} members it still needs fit now); member {} does not fit: {msg}",
                placed.len(),
                convert::pod_key(first)
            );
            for p in placed
                .iter()
                .map(|(p, _)| p)
                .chain(refused.iter().map(|(p, _, _)| p))
            {
                self.failed(p, why.clone(), "gang does not fit".into());
            }
            return;
        }
        drop(m);
        for (p, message, reason) in refused {
            self.failed(&p, message, reason);
        }
        for (p, d) in placed {
            self.spawn_bind(p, d);
        }
    }
}
