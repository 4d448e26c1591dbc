//! Experiments: *fill* (the FGD paper's protocol), *replay*, and
//! *tenants* (queues sharing the replay).

pub mod cost;
pub mod fill;
pub mod replay;
pub mod snapshot;
pub mod tenants;
