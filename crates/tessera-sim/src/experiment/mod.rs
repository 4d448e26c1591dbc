//! Experiments: *fill* (the FGD paper's protocol) and *replay*.

pub mod fill;
pub mod replay;
