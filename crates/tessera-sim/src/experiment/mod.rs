//! Experiments: *fill* (the FGD paper's protocol), *replay*, *tenants* (queues
//! sharing the replay), *gang* (distributed jobs, all-or-nothing or member by
//! member) and *defrag* (moves that free whole nodes).

pub mod cost;
pub mod defrag;
pub mod fill;
pub mod gang;
pub mod replay;
pub mod snapshot;
pub mod tenants;
