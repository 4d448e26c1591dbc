//! Experiments: *fill* (the FGD paper's protocol), *replay*, *tenants* (queues
//! sharing the replay), *preempt* (device-aware preemption against a
//! kube-scheduler-like baseline), *gang* (distributed jobs, all-or-nothing or
//! member by member), *defrag* (moves that free whole nodes) and *isolation*
//! (hard and soft shares under static MIG, MPS only and dynamic MIG), and *dra*
//! (kube-scheduler's first-fit DRA device allocation against Tessera's choice), and
//! *federation* (member clusters chosen by Karmada's integer estimate or Tessera's).

pub mod cost;
pub mod defrag;
pub mod dra;
pub mod federation;
pub mod fill;
pub mod gang;
pub mod isolation;
mod learner;
pub mod preempt;
pub mod replay;
pub mod snapshot;
pub mod tenants;
