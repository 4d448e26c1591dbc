//! Tessera's Kubernetes custom resources, shared by the scheduler (which reads
//! them) and the node agent (which writes them). Only types and their schema
//! live here: no client code, so both sides link it without pulling in the other.

pub mod crd;
pub mod gpunode;
pub mod podgroup;
pub mod queue;

pub use gpunode::{
    ContainerDevices, GpuCondition, GpuDevice, GpuHealth, GpuLink, GpuNode, GpuNodeSpec,
    GpuNodeStatus, LinkKind, MigInstance, MigState, MpsDaemonState, PodResourcesReport,
};
pub use podgroup::{POD_GROUP_LABEL, PodGroup, PodGroupSpec};
pub use queue::{GpuQueue, GpuQueueSpec, GpuQueueStatus, QueueResources};
