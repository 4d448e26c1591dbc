//! Why a pod does not fit: typed reasons, counted per node and turned into one sentence.
//!
//! "Does not fit" is never an `Err`: the filter returns a [`Reason`] per node, and
//! [`Explanation`] aggregates them, e.g.
//! `0/1213 nodes fit: 812 no single GPU with 20000 MiB free, 401 GPU model not allowed`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Why one node cannot take a request. Closed set: every adapter reports through it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum Reason {
    /// Not enough free CPU.
    Cpu { want_milli: u64 },
    /// Not enough free memory.
    Memory { want_mib: u64 },
    /// The node has fewer GPUs in total than the pod asks for.
    TooFewGpus { want: u32 },
    /// None of the node's GPU models is allowed.
    ModelNotAllowed,
    /// Every GPU is unhealthy.
    Unhealthy,
    /// Not enough idle GPUs for a whole-GPU request.
    NotEnoughIdleGpus { want: u32 },
    /// No GPU has this much free memory.
    NoGpuWithMemory { want_mib: u64 },
    /// No GPU has this much free compute.
    NoGpuWithCores { want_milli: u32 },
    /// Fewer GPUs than asked have room for the share.
    NotEnoughSharedGpus { want: u32 },
    /// No GPU is in MIG mode with this profile.
    NoMigGpu { profile: String },
    /// Instances of this profile exist on the node's MIG GPUs, but every one is granted.
    NoMigSlot { profile: String },
    /// The node's MIG GPUs offer this profile but no instance of it exists, and the
    /// node does not let Tessera create one (label `tessera.io/mig-dynamic`), or
    /// has no room for one.
    NoMigInstance { profile: String },
    /// No NVLink-connected set of the asked size.
    NoNvlinkSet { want: u32 },
    /// The pinned GPUs are not on this node, or are not free.
    PinnedGpusUnavailable,
    /// The fitting GPUs span architectures and the pod wants one.
    MixedArchitecture,
    /// The node is excluded by something outside the GPU model (selector, taint, not ready, …).
    Excluded { why: String },
    /// The policy declined the node.
    PolicyDeclined { policy: String },
    /// A countable resource of the node that the pod takes (a pod slot, a device
    /// plugin's resource) is used up: unlike [`Reason::Excluded`], freeing pods helps.
    NodeResource { why: String },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Cpu { want_milli } => write!(f, "not enough free CPU ({want_milli} m)"),
            Reason::Memory { want_mib } => write!(f, "not enough free memory ({want_mib} MiB)"),
            Reason::TooFewGpus { want } => write!(f, "fewer than {want} GPUs in total"),
            Reason::ModelNotAllowed => write!(f, "GPU model not allowed"),
            Reason::Unhealthy => write!(f, "no healthy GPU"),
            Reason::NotEnoughIdleGpus { want } => write!(f, "fewer than {want} idle GPUs"),
            Reason::NoGpuWithMemory { want_mib } => {
                write!(f, "no single GPU with {want_mib} MiB free")
            }
            Reason::NoGpuWithCores { want_milli } => {
                write!(
                    f,
                    "no single GPU with {}.{}% compute free",
                    want_milli / 10,
                    want_milli % 10
                )
            }
            Reason::NotEnoughSharedGpus { want } => {
                write!(f, "fewer than {want} GPUs with room for the share")
            }
            Reason::NoMigGpu { profile } => write!(f, "no MIG GPU offering {profile}"),
            Reason::NoMigSlot { profile } => write!(f, "every {profile} MIG instance is in use"),
            Reason::NoMigInstance { profile } => write!(
                f,
                "no {profile} MIG instance exists on a GPU, and Tessera may not create one here (that needs the node label tessera.io/mig-dynamic and free MIG space)"
            ),
            Reason::NoNvlinkSet { want } => write!(f, "no {want} NVLink-connected free GPUs"),
            Reason::PinnedGpusUnavailable => write!(f, "pinned GPUs not free here"),
            Reason::MixedArchitecture => write!(f, "free GPUs span architectures"),
            Reason::Excluded { why } => write!(f, "{why}"),
            Reason::PolicyDeclined { policy } => write!(f, "declined by policy {policy}"),
            Reason::NodeResource { why } => write!(f, "{why}"),
        }
    }
}

/// Per-reason node counts for one request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Nodes considered.
    pub total: usize,
    /// Nodes that fit.
    pub fit: usize,
    /// Nodes rejected, by reason (JSON: a list of `{reason, message, nodes}`, most frequent first).
    #[serde(serialize_with = "ranked_list")]
    pub rejected: BTreeMap<Reason, usize>,
}

fn rank(map: &BTreeMap<Reason, usize>) -> Vec<(&Reason, usize)> {
    let mut v: Vec<(&Reason, usize)> = map.iter().map(|(r, n)| (r, *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v
}

fn ranked_list<S: serde::Serializer>(
    map: &BTreeMap<Reason, usize>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Entry<'a> {
        reason: &'a Reason,
        message: String,
        nodes: usize,
    }
    s.collect_seq(rank(map).into_iter().map(|(reason, nodes)| Entry {
        reason,
        message: reason.to_string(),
        nodes,
    }))
}

impl Explanation {
    pub fn new(total: usize) -> Explanation {
        Explanation {
            total,
            ..Explanation::default()
        }
    }

    pub fn add(&mut self, reason: Reason) {
        *self.rejected.entry(reason).or_default() += 1;
    }

    /// Reasons with counts, most frequent first (ties in reason order).
    pub fn ranked(&self) -> Vec<(&Reason, usize)> {
        rank(&self.rejected)
    }

    /// The most frequent reason, as a metrics label and event reason
    /// (`no nodes` when no node was judged).
    pub fn top_reason(&self) -> String {
        self.ranked()
            .first()
            .map_or_else(|| "no nodes".into(), |(r, _)| r.to_string())
    }

    /// Adds another explanation's counts (e.g. reasons found outside the core's filter).
    pub fn merge(&mut self, other: &Explanation) {
        self.fit += other.fit;
        for (r, n) in &other.rejected {
            *self.rejected.entry(r.clone()).or_default() += n;
        }
    }
}

impl fmt::Display for Explanation {
    /// `0/1213 nodes fit: 812 no single GPU with 20000 MiB free, 401 GPU model not allowed`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} nodes fit", self.fit, self.total)?;
        let ranked = self.ranked();
        if !ranked.is_empty() {
            write!(f, ":")?;
            for (i, (reason, n)) in ranked.iter().enumerate() {
                write!(f, "{} {n} {reason}", if i == 0 { "" } else { "," })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_orders_by_count() {
        let mut e = Explanation::new(1213);
        for _ in 0..401 {
            e.add(Reason::ModelNotAllowed);
        }
        for _ in 0..812 {
            e.add(Reason::NoGpuWithMemory { want_mib: 20_000 });
        }
        assert_eq!(
            e.to_string(),
            "0/1213 nodes fit: 812 no single GPU with 20000 MiB free, 401 GPU model not allowed"
        );
        assert_eq!(e.top_reason(), "no single GPU with 20000 MiB free");
        assert_eq!(Explanation::new(0).top_reason(), "no nodes");
    }
}
