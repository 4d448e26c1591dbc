//! Tessera's allocator for DRA `ResourceClaim`s (issue 29, scheduler side).
//!
//! The node agent publishes its GPUs as `ResourceSlice`s of driver
//! `gpu.tessera.io` (`tessera-node`'s `dra::slice`). kube-scheduler's own DRA
//! allocator takes the first devices that fit; this module chooses them with
//! Tessera's fragmentation-aware policy instead, as the simulator's `dra`
//! experiment measures. It is shaped like the rest of the crate: pure
//! decisions on a snapshot, and one thin step that writes them.
//!
//! - [`types`]: the `resource.k8s.io/v1` wire objects (our own serde structs:
//!   the workspace's `k8s-openapi` predates `v1`).
//! - [`quantity`]: exact `resource.Quantity` arithmetic.
//! - [`cel`]: device selectors.
//! - [`claim`]: a claim checked and resolved into what the allocator needs,
//!   with errors naming the field at fault.
//! - [`inventory`]: one node's devices (from its slices) and what other claims
//!   already hold of them.
//! - [`allocate`]: the allocator: feasibility, constraints, `firstAvailable`,
//!   and the device choice through [`choose`], which asks the core policy,
//!   and [`mig`], which places MIG partitions by the core's MIG layout.
//! - [`write`]: `status.allocation` and `status.reservedFor` through the
//!   status subresource, with the claim's `resourceVersion` as precondition.
//! - [`pod`]: the claims a pod uses and what each still needs (allocate,
//!   reserve, nothing), or why the pod waits or is refused.
//! - [`place`]: the node for a pod's claims, by the allocator's score.
//! - [`quota`]: what claims' devices count against queue quotas.
//! - [`overlay`]: allocations written but not yet shown by the watch.
//! - [`view`]: the watched claims, slices and classes plus the overlay;
//!   [`watch`] feeds it (standalone mode with `--dra`).

pub mod allocate;
pub mod cel;
pub mod choose;
pub mod claim;
pub mod inventory;
pub mod mig;
pub mod overlay;
pub mod place;
pub mod pod;
pub mod preempt;
pub mod quantity;
pub mod quota;
pub mod types;
pub mod view;
pub mod watch;
pub mod write;

#[cfg(test)]
mod tests;

/// The driver the node agent registers.
pub const DRIVER: &str = "gpu.tessera.io";
/// The device classes the chart renders: whole GPUs and MIG devices.
pub const CLASS_GPU: &str = "gpu.tessera.io";
pub const CLASS_MIG: &str = "mig.tessera.io";
