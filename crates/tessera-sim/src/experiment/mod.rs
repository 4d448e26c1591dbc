//! Experiments: *fill* (the FGD paper's protocol) and *replay*, and *isolation*
//! (hard and soft shares under static MIG, MPS only and dynamic MIG).

pub mod cost;
pub mod fill;
pub mod isolation;
pub mod replay;
pub mod snapshot;
