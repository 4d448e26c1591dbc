//! Tessera's scheduling core.
//!
//! Pure: the cluster model, requests and their parser, the ledger of what is in
//! use, the shared fit filter, the placement policies (one file each), the
//! one node judge and its per-shape verdict cache, the scheduler that ranks nodes with them, fragmentation as FGD defines it,
//! explanations, and the allocation annotation that the scheduler and the node
//! agent share, the chargeback meter, and the replica estimate a federation engine asks for
//! (counted by placing, not by a second fit). No async, no I/O, no clock: state and request in, values out.
//! A test (`tests/purity.rs`) keeps it that way.

pub mod allocation;
pub mod chargeback;
pub mod containers;
pub mod estimate;
pub mod explain;
pub mod fit;
pub mod frag;
pub mod holdings;
pub mod judge;
pub mod ledger;
pub mod model;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod queue;
pub mod request;
pub mod scheduler;
pub mod workload;

pub use explain::{Explanation, Reason};
pub use ledger::{AllocId, Ledger};
pub use model::{Cluster, Gpu, GpuSpec, Node, NodeId};
pub use placement::Placement;
pub use policy::{Policy, PolicyArgs};
pub use request::Request;
pub use scheduler::{Decision, Scheduler};
