//! The Tessera command line as a library, so that two binaries share it: `tessera`
//! (every subcommand) and `kubectl-tessera`, the kubectl plugin ([`cmd::kubectl`]),
//! which kubectl finds on `PATH` by its name.

pub mod cmd;
