//! Extender mode: kube-scheduler calls us over HTTP for the GPU part of its decision.

pub mod forward;
pub mod preempt;
pub mod routes;
pub mod wire;

pub use routes::{ExtenderState, ops_router, router};
