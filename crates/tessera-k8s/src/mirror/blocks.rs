//! Why a node takes no new GPU grants: until the next rebuild finds it
//! consistent (what its bound pods hold cannot be counted in the ledger, so its
//! GPUs would look freer than they are), or until its node agent reports again
//! ([`Block::AgentSilent`], see [`super::liveness`]). One typed reason per
//! cause, worded in one place; the extender's filter, the standalone loop and
//! `tessera explain` show it as the node's rejection.

use std::fmt;

/// A node blocked for new grants, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A bound pod's grant does not fit what the others hold (two schedulers
    /// raced, an annotation was written by hand).
    Overcommitted { pod: String, problem: String },
    /// A bound pod's grant names a GPU (by UUID) the node no longer lists.
    GrantedGpuGone { pod: String, uuid: String },
    /// A bound pod asks GPUs but has no grant Tessera can read, and the node
    /// agent has not reported which GPUs the kubelet gave it.
    AwaitingReport { pod: String, grant: Unread },
    /// The node agent could not say which GPU a device held by `pod` is on.
    UnresolvedDevice {
        pod: String,
        resource: String,
        device: String,
    },
    /// A GPU the kubelet lists for a pod served by another device plugin is
    /// also (partly) granted by Tessera, or cannot be counted as held whole.
    HeldTwice {
        pod: String,
        uuid: String,
        why: String,
    },
    /// The node's `GpuNode` promises heartbeats but has not changed for
    /// `silent_s` seconds (at least the TTL, `ttl_s`): its agent is gone, and
    /// the kubelet would refuse GPU pods. Measured on the scheduler's clock.
    AgentSilent {
        gpunode: String,
        silent_s: u64,
        ttl_s: u64,
    },
}

/// Why a bound GPU pod's grant cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// It has none: another scheduler or device plugin gave it its GPUs.
    NoGrant,
    /// Its annotation does not verify (signed with an old key, edited, forged).
    Invalid(String),
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Block::Overcommitted { pod, problem } => write!(
                f,
                "bound pods hold more than its GPUs have (pod {pod}: {problem}); nothing more is placed here until they leave"
            ),
            Block::GrantedGpuGone { pod, uuid } => write!(
                f,
                "pod {pod} was granted GPU {uuid}, which the node no longer lists; nothing more is placed here until the pod leaves or the GPU is back"
            ),
            Block::AwaitingReport {
                pod,
                grant: Unread::NoGrant,
            } => write!(
                f,
                "pod {pod} holds GPUs through another device plugin; waiting for the node agent to report which"
            ),
            Block::AwaitingReport {
                pod,
                grant: Unread::Invalid(why),
            } => write!(
                f,
                "pod {pod} holds GPUs under a grant that cannot be read ({why}); waiting for the node agent to report which"
            ),
            Block::UnresolvedDevice {
                pod,
                resource,
                device,
            } => write!(
                f,
                "pod {pod} holds {resource} device {device}, which the node agent could not place on a GPU; nothing more is placed here until it can"
            ),
            Block::HeldTwice { pod, uuid, why } => write!(
                f,
                "GPU {uuid} is held by pod {pod} through another device plugin and cannot be counted ({why}); nothing more is placed here until one leaves"
            ),
            Block::AgentSilent {
                gpunode,
                silent_s,
                ttl_s,
            } => write!(
                f,
                "GpuNode {gpunode} has not changed for {silent_s}s (its node agent heartbeats; stale after {ttl_s}s): the agent has stopped reporting, so nothing new is placed here until it reports again; pods already here stay counted (a GpuNode without status.heartbeatTime, from an older agent, is never taken as stale)"
            ),
        }
    }
}
