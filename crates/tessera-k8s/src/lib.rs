//! Tessera's Kubernetes scheduler.
//!
//! A [`mirror::Mirror`] of nodes, pods and `GpuNode` inventory (fed by kube-rs
//! watchers) holds the core cluster and ledger; every allocation in it comes
//! from the API server's pod annotations. On top of it: the kube-scheduler
//! extender ([`extender`]), the standalone scheduler ([`standalone`]), the
//! [`binder`] that writes decisions, leader election ([`leader`]), the
//! admission [`webhook`], [`metrics`], `GpuQueue` status ([`queue_status`]), the web view [`ui`] and the GPU
//! [`accounting`] behind chargeback; Karmada's scheduler-estimator ([`estimator`],
//! `tessera estimator`) answers from a mirror of its own. [`run`] wires them together and stops
//! when its shutdown future resolves; only the binary owns signals.

pub mod accounting;
pub mod bench;
pub mod binder;
pub mod client;
pub mod convert;
pub mod dra;
pub mod estimator;
pub mod events;
pub mod explain;
pub mod extender;
pub mod gate;
pub mod hostfit;
pub mod kueue;
pub mod leader;
pub mod metrics;
pub mod mirror;
pub mod preemptor;
pub mod queue_status;
pub mod run;
pub mod standalone;
pub mod tls;
pub mod ui;
pub mod view;
pub mod webhook;
