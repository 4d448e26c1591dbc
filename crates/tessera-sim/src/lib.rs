//! Tessera's proving ground: trace-driven simulation of GPU cluster scheduling.
//!
//! Deterministic discrete-event loop (integer time, events ordered by time then
//! sequence, one seeded RNG passed explicitly). Two experiments: *fill* (the FGD
//! paper's protocol: pods arrive in a seeded order, never leave) and *replay*
//! (pods arrive and leave at their trace times, pending pods queue).

pub mod experiment;
pub mod grid;
pub mod metrics;
pub mod report;
pub mod trace;
pub mod variant;
pub mod workload;
