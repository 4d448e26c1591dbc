//! Whether each node's agent is still there. A `GpuNode` outlives its agent
//! (the agent crashed in a loop, its DaemonSet no longer runs on the node), and
//! the inventory it last wrote would keep drawing pods to a node whose kubelet
//! has no `tessera.io/gpu` devices to give them: they fail admission and come
//! back, again and again. Anything remembered expires, so a `GpuNode` whose
//! agent promises heartbeats (`status.heartbeatTime`, rewritten every
//! [`HEARTBEAT_PERIOD`]) and that has not changed for [`INVENTORY_TTL`] is
//! *stale*: its node takes no new pods ([`Block::AgentSilent`]) until the
//! object changes again. What is already placed there stays counted: the pods
//! still hold their GPUs whatever the agent does.
//!
//! Staleness is measured on the scheduler's own monotonic clock, from when the
//! mirror last saw the object change (a new `resourceVersion`), never by
//! comparing the agent's wall-clock `heartbeatTime` with the scheduler's: the
//! two clocks may disagree by more than the TTL. So a restarted scheduler
//! starts every clock at its initial list (a restart never blocks every node at
//! once; a dead agent's node is blocked one TTL later), and a relist keeps the
//! clock of an object that did not change meanwhile.
//!
//! A `GpuNode` without `heartbeatTime` (an agent older than heartbeats, an
//! object written by hand for a node without an agent) is never stale: nothing
//! promised it would change.
//!
//! The check runs in [`Mirror::refresh`], which every decision calls first, so a
//! node turns stale without waiting for an unrelated event; a scan of the
//! inventory is skipped until the earliest moment one can turn stale. A change
//! of staleness forgets the node's cached verdicts: a "fits" kept from before
//! would place a pod there anyway.

use std::time::Duration;

use tessera_api::GpuNode;
use tessera_api::gpunode::HEARTBEAT_PERIOD;
use tokio::time::Instant;

use super::{Block, Mirror};

/// How long a heartbeating `GpuNode` may stay unchanged before its node takes
/// no new pods: three heartbeat periods, so one lost write or a slow watch does
/// not block a live node. `tessera scheduler --gpunode-ttl` overrides it.
pub const INVENTORY_TTL: Duration = Duration::from_secs(3 * HEARTBEAT_PERIOD.as_secs());

/// Whether `new` is a change from `old` as the API server counts changes: another
/// `resourceVersion`. Objects without one (built in memory, not read from an
/// API server) are compared whole.
pub(super) fn changed(old: &GpuNode, new: &GpuNode) -> bool {
    match (
        &old.metadata.resource_version,
        &new.metadata.resource_version,
    ) {
        (Some(a), Some(b)) => a != b,
        _ => old != new,
    }
}

/// Whether the object's writer promises to rewrite it every heartbeat period.
pub(super) fn heartbeats(gn: &GpuNode) -> bool {
    gn.status
        .as_ref()
        .is_some_and(|s| s.heartbeat_time.is_some())
}

/// One `GpuNode`'s liveness at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Liveness {
    /// No heartbeat promised: never stale.
    Unwatched,
    /// Changed recently enough; stale from `until` on unless it changes again.
    Live { until: Instant },
    /// Unchanged for `silent` (at least the TTL).
    Stale { silent: Duration },
}

/// `gn`'s liveness at `now`, last seen changing at `changed_at`.
pub(super) fn liveness(gn: &GpuNode, changed_at: Instant, now: Instant, ttl: Duration) -> Liveness {
    if !heartbeats(gn) {
        return Liveness::Unwatched;
    }
    let silent = now.saturating_duration_since(changed_at);
    if silent >= ttl {
        Liveness::Stale { silent }
    } else {
        Liveness::Live {
            until: changed_at + ttl,
        }
    }
}

impl Mirror {
    /// Sets how long a heartbeating `GpuNode` may stay unchanged (default
    /// [`INVENTORY_TTL`]); every node is judged again under the new TTL.
    pub fn set_inventory_ttl(&mut self, ttl: Duration) {
        self.inventory_ttl = ttl;
        self.next_liveness = Some(Instant::now());
    }

    /// Records that the mirror saw `new` arrive for `name` (with `old` before
    /// it): a change restarts its clock and lifts a staleness block. Returns
    /// whether it lifted one (a pass is worth running: pods may go there again).
    pub(super) fn saw_inventory(
        &mut self,
        name: &str,
        old: Option<&GpuNode>,
        new: &GpuNode,
    ) -> bool {
        if old.is_some_and(|o| !changed(o, new)) {
            return false;
        }
        let now = Instant::now();
        self.inventory_changed.insert(name.to_string(), now);
        if heartbeats(new) {
            let until = now + self.inventory_ttl;
            self.next_liveness = Some(self.next_liveness.map_or(until, |t| t.min(until)));
        }
        let lifted = self.stale.remove(name).is_some();
        if lifted {
            tracing::info!(
                gpunode = name,
                "GpuNode changed again: its node agent is back, the node takes pods again"
            );
            self.forget_verdicts_of(name);
        }
        lifted
    }

    /// The clocks after a full list: objects unchanged since the mirror last saw
    /// them keep theirs; new and changed ones start now (so do all of them in a
    /// fresh mirror: a restarted scheduler blocks nothing at once).
    pub(super) fn saw_inventory_list(&mut self, old: &std::collections::BTreeMap<String, GpuNode>) {
        let now = Instant::now();
        let mut clocks = std::collections::HashMap::with_capacity(self.inventory.len());
        for (name, gn) in &self.inventory {
            let kept = old
                .get(name)
                .filter(|o| !changed(o, gn))
                .and_then(|_| self.inventory_changed.get(name).copied());
            if kept.is_none() {
                self.stale.remove(name);
            }
            clocks.insert(name.clone(), kept.unwrap_or(now));
        }
        self.inventory_changed = clocks;
        let inventory = &self.inventory;
        self.stale.retain(|name, _| inventory.contains_key(name));
        // The cluster is rebuilt after a list (verdicts and all); judge every node again.
        self.next_liveness = Some(now);
    }

    /// The `GpuNode` is gone: so are its clock and any block on it.
    pub(super) fn forget_inventory_clock(&mut self, name: &str) {
        self.inventory_changed.remove(name);
        if self.stale.remove(name).is_some() {
            self.forget_verdicts_of(name);
        }
    }

    /// Blocks the nodes whose `GpuNode` has turned stale since the last check.
    /// Called by [`Mirror::refresh`]; scans only once one may have.
    pub(super) fn expire_inventory(&mut self) {
        let now = Instant::now();
        if self.next_liveness.is_none_or(|t| now < t) {
            return;
        }
        let mut next: Option<Instant> = None;
        let mut turned = Vec::new();
        let mut stale = std::collections::HashMap::new();
        for (name, gn) in &self.inventory {
            let Some(&at) = self.inventory_changed.get(name) else {
                continue;
            };
            match liveness(gn, at, now, self.inventory_ttl) {
                Liveness::Unwatched => {}
                Liveness::Live { until } => next = Some(next.map_or(until, |t| t.min(until))),
                Liveness::Stale { silent } => {
                    // A node already blocked keeps its reason (and its cached verdicts).
                    let block = self.stale.remove(name).unwrap_or_else(|| {
                        turned.push(name.clone());
                        Block::AgentSilent {
                            gpunode: name.clone(),
                            silent_s: silent.as_secs(),
                            ttl_s: self.inventory_ttl.as_secs(),
                        }
                    });
                    stale.insert(name.clone(), block);
                }
            }
        }
        // Left over: no longer stale without a change seen (its heartbeat field
        // went away, a longer TTL): judged again.
        let lifted: Vec<String> = std::mem::replace(&mut self.stale, stale)
            .into_keys()
            .collect();
        self.next_liveness = next;
        for name in &turned {
            tracing::warn!(gpunode = %name, ttl_s = self.inventory_ttl.as_secs(), "GpuNode unchanged for longer than its TTL: its node agent has stopped reporting; no new pods are placed on the node until it reports again");
        }
        for name in turned.iter().chain(&lifted) {
            self.forget_verdicts_of(name);
        }
    }

    /// The staleness block on node `name`, if it has one.
    pub(super) fn stale_block(&self, name: &str) -> Option<&Block> {
        self.stale.get(name)
    }

    fn forget_verdicts_of(&mut self, name: &str) {
        if let Some(id) = self.by_name.get(name).copied() {
            self.verdicts.forget(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpunode(heartbeat: Option<&str>, rv: Option<&str>) -> GpuNode {
        let mut gn = GpuNode::new("n", Default::default());
        gn.metadata.resource_version = rv.map(str::to_string);
        gn.status = Some(tessera_api::GpuNodeStatus {
            heartbeat_time: heartbeat.map(str::to_string),
            ..Default::default()
        });
        gn
    }

    /// Table: (heartbeat promised, seconds since the last change, TTL 90 s) → liveness.
    #[test]
    fn stale_only_with_a_heartbeat_and_a_ttl_of_silence() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(90);
        let beat = Some("2026-12-04T19:00:00Z");
        let cases = [
            // Never promised a heartbeat: never stale, however long.
            (None, 10_000, Liveness::Unwatched),
            // 89 s < 90 s: live, stale at 0 + 90 s.
            (
                beat,
                89,
                Liveness::Live {
                    until: t0 + Duration::from_secs(90),
                },
            ),
            // 90 s ≥ 90 s: stale, silent 90 s.
            (
                beat,
                90,
                Liveness::Stale {
                    silent: Duration::from_secs(90),
                },
            ),
            (
                beat,
                400,
                Liveness::Stale {
                    silent: Duration::from_secs(400),
                },
            ),
        ];
        for (hb, after_s, want) in cases {
            let now = t0 + Duration::from_secs(after_s);
            assert_eq!(
                liveness(&gpunode(hb, None), t0, now, ttl),
                want,
                "{hb:?} {after_s}"
            );
        }
    }

    /// A change is a new resourceVersion; the heartbeat time itself is not read.
    #[test]
    fn a_change_is_a_new_resource_version() {
        let a = gpunode(Some("2026-12-04T19:00:00Z"), Some("10"));
        // Same version, whatever the contents say: no change (a relist).
        let same = gpunode(Some("2999-01-01T00:00:00Z"), Some("10"));
        assert!(!changed(&a, &same));
        let next = gpunode(Some("2026-12-04T19:00:00Z"), Some("11"));
        assert!(changed(&a, &next));
        // Without versions (built in memory): compared whole.
        let (x, y) = (gpunode(Some("t1"), None), gpunode(Some("t2"), None));
        assert!(changed(&x, &y));
        assert!(!changed(&x, &x.clone()));
    }
}
