//! Gangs in standalone mode: all or nothing, at least the `PodGroup`'s `minMember`.
//!
//! Members may ask for devices either way, `tessera.io/*` resources or DRA
//! `ResourceClaim`s (with `--dra`), and a gang may mix both: every member is
//! decided under the mirror's lock, and, when any member has claims, the DRA
//! view's after it ([`super::claims`]' lock order), so each member's claims
//! are allocated around the devices assumed for the members before it.
//!
//! Decided all or nothing, applied one by one: after the gang is decided,
//! each member is written on its own (a Binding with its annotation, or its
//! claims then a Binding), as a single pod is. If one member's write fails
//! (a claim changed meanwhile, a refused Binding), that member alone gives
//! back what it held and is decided again on a later pass, while the others
//! stay bound; the gang then counts them as placed and needs only the rest.
//! A gang is thus never bound partly because it did not fit, but can be for
//! a while after a failed write, as on the device-plugin path alone.

use k8s_openapi::api::core::v1::Pod;

use super::claims::{DraDecided, count_claims, decide_dra_locked};
use super::{Decided, Standalone, decide_locked};
use crate::convert;
use crate::dra::pod::uses_claims;
use crate::dra::view::SharedDraView;

/// A decided member: the device-plugin path's, or the DRA path's (with the
/// view its claims were decided on).
enum Member {
    Plugin(Decided),
    Dra(SharedDraView, DraDecided),
}

impl Standalone {
    /// Places gang `key` (`namespace/name` of its `PodGroup`) all or nothing:
    /// every waiting member is decided and held under one lock (the mirror's,
    /// then the DRA view's too if a member has claims), largest first; unless
    /// at least `minMember` members (counting those already placed) are then
    /// held, every hold of this attempt, and every claim allocation it
    /// assumed, is dropped before the locks are released and each member gets
    /// an event saying why. A waiting gang holds
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
        // Locked after the mirror, at the first member with claims, and held
        // to the end: each member's claims see what the earlier ones assumed.
        let mut v = None;
        let mut placed: Vec<(Pod, Member)> = Vec::new();
        let mut refused: Vec<(Pod, String, String)> = Vec::new();
        let nominated = self.preemptor.nominated();
        for p in members {
            let decided = if !uses_claims(&p) {
                decide_locked(&mut m, &self.metrics, &p, &nominated).map(Member::Plugin)
            } else {
                // `--dra` off or not served: the sentence a single pod gets.
                self.dra.view(&p).and_then(|view| {
                    let v = v.get_or_insert_with(|| view.lock());
                    decide_dra_locked(&mut m, v, &self.metrics, &p, &nominated)
                        .map(|d| Member::Dra(view.clone(), d))
                })
            };
            match decided {
                Ok(d) => placed.push((p, d)),
                Err((message, reason)) => refused.push((p, message, reason)),
            }
        }
        if placed.len() < need {
            for (p, d) in &placed {
                if let (Member::Dra(_, d), Some(v)) = (d, v.as_deref_mut()) {
                    d.unassume(v);
                }
                m.unreserve(convert::pod_uid(p));
            }
            if let Some(v) = v.as_deref_mut() {
                // The undone members' claims no longer count in their queues.
                count_claims(&mut m, v);
            }
            drop(v);
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
        drop(v);
        drop(m);
        for (p, message, reason) in refused {
            self.failed(&p, message, reason);
        }
        for (p, d) in placed {
            match d {
                Member::Plugin(d) => self.spawn_bind(p, d),
                Member::Dra(view, d) => self.spawn_dra(view, p, d),
            }
        }
    }
}
