//! Jepsen-style fault harness: drives concurrent clients against a real ftkv cluster while a
//! nemesis injects faults, records a [`history`], checks it with the [`checker`]s and writes a
//! report. Design: `shared/design/TESTING.md`; names follow Jepsen (db, client, nemesis,
//! generator, history, checker).

pub mod checker;
pub mod db;
pub mod history;
pub mod nemesis;
pub mod netns;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod workload;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod canary;
