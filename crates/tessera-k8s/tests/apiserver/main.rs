//! Tests of the API-server double against the recorded v1.28 server
//! (`../shared/fixtures/kube-apiserver-v1.28/`).

#[path = "mod.rs"]
mod apiserver;

mod behaviour;
mod replay;
mod units;
mod watches;
