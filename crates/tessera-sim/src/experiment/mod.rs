//! Experiments: *fill* (the FGD paper's protocol) and *replay*.

pub mod cost;
pub mod fill;
pub mod replay;
pub mod snapshot;
