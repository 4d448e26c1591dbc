//! Tessera's node agent.
//!
//! Runs on every GPU node: discovers the GPUs ([`backend`]), tells the kubelet
//! about them and hands each container exactly what the scheduler decided
//! ([`deviceplugin`]), withdraws failing GPUs and brings them back ([`health`]),
//! publishes the node's `GpuNode` object and GFD-style labels ([`inventory`]),
//! and exports DCGM-compatible metrics with per-pod attribution ([`metrics`]),
//! and creates and destroys the MIG instances the scheduler plans ([`migplan`]).
//! [`run`] wires them together; the binary owns signals and exit codes.

pub mod backend;
pub mod deviceplugin;
pub mod dra;
pub mod health;
pub mod inventory;
pub mod metrics;
pub mod migplan;
pub mod mps;
pub mod nodesettings;
pub mod podresources;
pub mod pods;
pub mod proto;
pub mod run;
pub mod snapshot;
pub mod startup;
