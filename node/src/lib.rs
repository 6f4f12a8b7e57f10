//! The ftkv node: a replicated, write-optimized key-value server.
//!
//! Layers, top to bottom (ARCHITECTURE.md): [`server`] (gRPC `ftkv.v1` services, health,
//! reflection, status HTTP) → [`cluster`] (openraft glue: proposal batcher, reads, log-store and
//! state-machine adapters, peer network) → `ftkv-log` (group-committed log) and `ftkv-engine`
//! (fractal tree, sled). [`config`] and [`limits`] are shared by all.
//!
//! Only `cluster` names openraft types; nothing below `server` formats a gRPC status. This crate
//! never depends on the engine's internals (only the `Engine` trait).

pub mod auth;
pub mod backup;
pub mod check_config;
pub mod cluster;
pub mod config;
pub mod limits;
pub mod notify;
pub mod playground;
pub mod run;
pub mod server;
pub mod space;
pub mod telemetry;
pub mod tls;
