//! Jepsen-style fault harness: drives concurrent clients against a real ftkv cluster while a
//! nemesis injects faults, records a [`history`], checks it with the [`checker`]s and writes a
//! report. Usage: README.md, "Fault testing (Jepsen-style)"; names follow Jepsen (db, client, nemesis,
//! generator, history, checker).
//!
//! Layout, top-down: [`runner`] (one run: setup, workers, nemesis, final phase, checks, report),
//! [`scenario`] (scripted runs from `tests/scenarios/*.toml`), [`workload`] (seeded op generators
//! and their execution through `ftkv-client`), [`nemesis`] (faults and their seeded schedule),
//! [`db`] (the cluster on a substrate: [`crate::fixture`] for `local`, [`netns`] for network
//! namespaces, [`docker`] for containers of the ftkv image; [`security`] for TLS and auth runs), [`history`] (the JSON-lines history), [`checker`] (pure, unit-tested checkers) and
//! [`report`] (timeline and plots). The binary is `ftkv-jepsen` (`src/bin/ftkv-jepsen.rs`); usage
//! in `tests/scenarios/README.md`.

pub mod checker;
pub mod db;
pub mod docker;
pub mod history;
pub mod nemesis;
pub mod netns;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod security;
mod substrate;
pub mod workload;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod canary;
