//! ftkv's test tooling: cluster fixtures that run real `ftkv-node` processes ([`fixture`]), and
//! the Jepsen-style fault harness ([`jepsen`]; binary `ftkv-jepsen`), and side-by-side benchmarks
//! ([`bench`]; binary `ftkv-bench`).
//!
//! Depends on the client library and the wire protocol only: it drives the cluster from the
//! outside as a user would, never through node internals.

pub mod bench;
pub mod fixture;
pub mod jepsen;
