//! Implementation of the `ftkvctl` command-line tool (not a stable library API).

pub mod hex;
pub mod txn_script;
