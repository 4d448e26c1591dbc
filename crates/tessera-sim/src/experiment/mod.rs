//! Experiments: *fill* (the FGD paper's protocol), *replay*, *tenants* (queues
//! sharing the replay) and *preempt* (device-aware preemption against a
//! kube-scheduler-like baseline).

pub mod cost;
pub mod fill;
pub mod preempt;
pub mod replay;
pub mod snapshot;
pub mod tenants;
