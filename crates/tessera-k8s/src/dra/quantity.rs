//! `resource.Quantity` as an exact number: the core's ([`tessera_core::quantity`]),
//! shared with the node agent, which reads the same `consumedCapacity`.

pub use tessera_core::quantity::{Quantity, QuantityError};
