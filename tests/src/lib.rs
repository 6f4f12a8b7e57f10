//! ftkv's test tooling: cluster fixtures that run real `ftkv-node` processes ([`fixture`]), and
//! the Jepsen-style fault harness ([`jepsen`]; binary `ftkv-jepsen`).
//!
//! Depends on the client library and the wire protocol only: it drives the cluster from the
//! outside as a user would, never through node internals.

pub mod fixture;
pub mod jepsen;
