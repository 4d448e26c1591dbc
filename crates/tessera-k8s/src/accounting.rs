//! The scheduler's GPU accounting: what every bound pod holds, read from the
//! mirror (so from the pods' signed grants, the same truth the ledger is built
//! from), fed to the core's chargeback [`Meter`] by the UI observer each tick,
//! and served on the ops port:
//!
//! `GET /chargeback?from=UNIX_S&to=UNIX_S` answers a [`Usage`] document: the
//! meter's buckets starting in `[from, to)` (both optional), each with GPU time
//! per namespace (and its `GpuQueue`), model and mode and each model's allocated and capacity
//! integrals. `tessera chargeback` prices it; pricing is not the scheduler's
//! business, so a price table can change without a restart and a bill can be
//! re-made for any past range the scheduler still keeps.
//!
//! The buckets live in memory (5 minutes each, 7 days); a restarted scheduler
//! starts counting again. The Prometheus counters
//! `tessera_gpu_seconds_total{namespace,queue,model,mode}` and
//! `tessera_gpu_capacity_seconds_total{model}` are the long-term record.
//! Sampling every tick (2 s) means a pod's start and end are charged to the
//! nearest tick, not to the millisecond.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_core::chargeback::{Account, Bucket, Holding, Meter, Mode, ModelLoad};
use tessera_core::model::Health;

use crate::mirror::Mirror;

/// What every bound pod holds, by namespace, GPU model and mode, and the
/// healthy capacity of every model, from a cluster and the holds' grants
/// copied out of the mirror ([`GrantCopies`]). A reservation whose bind is
/// still in flight is not charged: its pod is not running yet.
pub(crate) fn holding(cluster: &tessera_core::Cluster, held: &[Arc<HeldGrants>]) -> Holding {
    let bound = held.iter().filter(|h| h.bound);
    let mut h = Holding::default();
    for node in cluster.nodes() {
        for g in &node.gpus {
            if g.health == Health::Healthy {
                *h.capacity_milli
                    .entry(cluster.catalog.spec(g.model).name.clone())
                    .or_default() += 1000;
            }
        }
    }
    for held in bound {
        let Some(node) = cluster.node_id(&held.node) else {
            continue;
        };
        let gpus = &cluster.node(node).gpus;
        let namespace = held.pod.split_once('/').map_or("", |(ns, _)| ns);
        let queue = held.queue.clone().unwrap_or_default();
        for g in &held.gpus {
            let Some(gpu) = gpus.iter().find(|x| x.index == g.index) else {
                continue;
            };
            h.add(
                Account {
                    namespace: namespace.to_string(),
                    model: cluster.catalog.spec(gpu.model).name.clone(),
                    mode: Mode::of_grant(g.cores_milli, g.mig_profile.is_some()),
                    queue: queue.clone(),
                },
                u64::from(g.cores_milli),
            );
        }
    }
    h
}

/// A held pod's GPU grants, copied out of the mirror (whose cluster is only
/// lent through a `&mut` borrow, so holds and cluster cannot be read together).
pub(crate) struct HeldGrants {
    pub node: String,
    /// `namespace/name`.
    pub pod: String,
    pub bound: bool,
    /// The `GpuQueue` it counts against.
    pub queue: Option<String>,
    pub gpus: Vec<HeldGpu>,
}

pub(crate) struct HeldGpu {
    /// NVML index.
    pub index: u32,
    pub cores_milli: u32,
    pub mig_profile: Option<String>,
}

/// A hold's grants, if it has an allocation.
fn copy_grants(h: &crate::mirror::Held, queue: Option<String>) -> Option<HeldGrants> {
    let alloc = h.allocation.as_ref()?;
    Some(HeldGrants {
        node: h.node.clone(),
        pod: h.pod.clone(),
        bound: h.bound,
        queue,
        gpus: alloc
            .gpus
            .iter()
            .map(|g| HeldGpu {
                index: g.index,
                cores_milli: g.cores_milli,
                mig_profile: g.mig.as_ref().map(|m| m.profile.clone()),
            })
            .collect(),
    })
}

/// Copies of the holds' grants kept between reads of the mirror: a hold is
/// copied again only when it is new or changed (its node, bound flag or
/// grants), so a read costs a lookup and a comparison per hold, not a copy
/// (tens of thousands of holds on a big cluster, read under the mirror's lock).
#[derive(Default)]
pub(crate) struct GrantCopies {
    by_uid: std::collections::HashMap<String, GrantCopy>,
    reads: u64,
}

impl GrantCopy {
    /// Whether the copy still says what the hold says.
    fn matches(&self, h: &crate::mirror::Held, queue: Option<&str>) -> bool {
        match (&self.grants, &h.allocation) {
            (None, None) => true,
            (Some(c), Some(a)) => {
                c.queue.as_deref() == queue
                    && c.node == h.node
                    && c.bound == h.bound
                    && c.gpus.len() == a.gpus.len()
                    && c.gpus.iter().zip(&a.gpus).all(|(x, y)| {
                        x.index == y.index
                            && x.cores_milli == y.cores_milli
                            && x.mig_profile.as_deref()
                                == y.mig.as_ref().map(|m| m.profile.as_str())
                    })
            }
            _ => false,
        }
    }
}

/// One hold's copy and what it was copied from.
struct GrantCopy {
    /// The read that last saw the hold.
    seen: u64,
    grants: Option<Arc<HeldGrants>>,
}

impl GrantCopies {
    /// Brings the copies up to date with `mirror` and returns them.
    pub(crate) fn read(&mut self, mirror: &Mirror) -> Vec<Arc<HeldGrants>> {
        self.reads += 1;
        let read = self.reads;
        for (uid, h) in mirror.holds() {
            // Compared borrowed: an unchanged hold costs no copy, its queue's name included.
            let queue = mirror.held_queue(uid, h);
            match self.by_uid.get_mut(uid.as_str()) {
                Some(c) if c.matches(h, queue) => c.seen = read,
                _ => {
                    let copy = GrantCopy {
                        seen: read,
                        grants: copy_grants(h, queue.map(str::to_string)).map(Arc::new),
                    };
                    self.by_uid.insert(uid.clone(), copy);
                }
            }
        }
        self.by_uid.retain(|_, c| c.seen == read);
        self.by_uid
            .values()
            .filter_map(|c| c.grants.clone())
            .collect()
    }
}

/// The answer of `GET /chargeback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub bucket_seconds: u64,
    /// Start of the oldest bucket the scheduler still keeps (unix s); earlier
    /// ranges are only in Prometheus.
    pub kept_from: Option<u64>,
    pub buckets: Vec<UsageBucket>,
}

/// One bucket on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageBucket {
    /// Unix seconds.
    pub start: u64,
    pub usage: Vec<UsageLine>,
    pub models: BTreeMap<String, ModelLoad>,
}

/// GPU time of one account in one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageLine {
    pub namespace: String,
    /// The `GpuQueue` (absent: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    pub model: String,
    pub mode: Mode,
    /// milli-GPU × milliseconds (10⁶ per GPU-second).
    pub milli_ms: u64,
}

impl Usage {
    /// The meter's buckets starting in `[from_s, to_s)`.
    pub fn from_meter(meter: &Meter, from_s: u64, to_s: u64) -> Usage {
        Usage {
            bucket_seconds: meter.bucket_ms() / 1000,
            kept_from: meter.kept_from_ms().map(|ms| ms / 1000),
            buckets: meter
                .buckets(from_s.saturating_mul(1000), to_s.saturating_mul(1000))
                .map(|b| UsageBucket {
                    start: b.start_ms / 1000,
                    usage: b
                        .usage
                        .iter()
                        .map(|(a, &m)| UsageLine {
                            namespace: a.namespace.clone(),
                            queue: a.queue.clone(),
                            model: a.model.clone(),
                            mode: a.mode,
                            milli_ms: m,
                        })
                        .collect(),
                    models: b.models.clone(),
                })
                .collect(),
        }
    }

    /// Back to the core's buckets, for [`tessera_core::chargeback::bill`].
    pub fn to_buckets(&self) -> Vec<Bucket> {
        self.buckets
            .iter()
            .map(|b| Bucket {
                start_ms: b.start.saturating_mul(1000),
                usage: b
                    .usage
                    .iter()
                    .map(|l| {
                        (
                            Account {
                                namespace: l.namespace.clone(),
                                model: l.model.clone(),
                                mode: l.mode,
                                queue: l.queue.clone(),
                            },
                            l.milli_ms,
                        )
                    })
                    .collect(),
                models: b.models.clone(),
            })
            .collect()
    }
}

/// The query of `GET /chargeback`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UsageQuery {
    /// Unix seconds (inclusive); default: everything kept.
    pub from: Option<u64>,
    /// Unix seconds (exclusive); default: now.
    pub to: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::Reservation;

    fn share(uid: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "team", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {
                "tessera.io/gpu": "1", "tessera.io/gpu-milli": "250"}}}]}
        }))
        .expect("a pod")
    }

    #[test]
    fn copies_follow_the_holds_and_only_changed_ones_are_copied_again() {
        let (nodes, inventory) = crate::bench::synthetic_objects(2);
        let policy = tessera_core::policy::by_name("tessera", &Default::default()).unwrap();
        let mut m = Mirror::from_objects(
            policy,
            b"0123456789abcdef".to_vec(),
            nodes,
            inventory,
            vec![],
        );
        for uid in ["a", "b"] {
            assert!(matches!(
                m.reserve(&share(uid), "node-00000"),
                Ok(Reservation::Write { .. })
            ));
        }
        let mut copies = GrantCopies::default();
        let first = copies.read(&m);
        assert_eq!(first.len(), 2);
        let again = copies.read(&m);
        assert!(
            first
                .iter()
                .all(|c| again.iter().any(|d| Arc::ptr_eq(c, d))),
            "unchanged holds are not copied again"
        );
        // "a" is released and placed again on the other node (its ledger id may be reused).
        m.unreserve("a");
        assert!(m.reserve(&share("a"), "node-00001").is_ok());
        let now = copies.read(&m);
        let a = now.iter().find(|c| c.pod == "team/a").expect("a copied");
        assert_eq!(a.node, "node-00001", "a moved: copied again");
        assert_eq!(now.len(), 2);
        m.unreserve("b");
        let left = copies.read(&m);
        assert_eq!(left.len(), 1, "a released hold's copy goes");
        assert_eq!(left[0].pod, "team/a");
    }
}
