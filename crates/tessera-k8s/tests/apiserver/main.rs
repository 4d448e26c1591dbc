//! Tests of the API-server double against the recorded v1.28 server
//! (`../shared/fixtures/kube-apiserver-v1.28/`), and of what it refuses as
//! the real server does ([`refusals`]).

#[path = "mod.rs"]
mod apiserver;

mod behaviour;
mod refusals;
mod replay;
mod units;
mod watches;
