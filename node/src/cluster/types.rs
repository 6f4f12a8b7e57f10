//! The one place that spells out openraft's type parameters (STYLE.md: hide them behind one
//! `TypeConfig` module). Everything else in `cluster/` uses the aliases below.

use std::io;

use serde::{Deserialize, Serialize};

use super::command::{Command, CommandResult};
use super::snapshot::SnapshotFile;
use super::NodeAddr;

/// Payload of one normal Raft entry: the commands the proposal batcher packed together,
/// applied in order and atomically (one engine write per apply round).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryCommands {
    /// Commands in proposal order.
    pub commands: Vec<Command>,
}

/// Result of applying one Raft entry: one [`CommandResult`] per command of a normal entry, none
/// for blank and membership entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResults {
    /// Results in command order.
    pub results: Vec<CommandResult>,
}

openraft::declare_raft_types!(
    /// ftkv's openraft configuration: u64 node ids, [`NodeAddr`] as node data, batched commands
    /// as entries, snapshot files as snapshot data, tokio.
    pub TypeConfig:
        D = EntryCommands,
        R = EntryResults,
        NodeId = u64,
        Node = NodeAddr,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// Node id type.
pub type NodeId = u64;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// Log id.
pub type LogId = openraft::LogId<NodeId>;
/// Log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// Vote.
pub type Vote = openraft::Vote<NodeId>;
/// Storage error.
pub type StorageError = openraft::StorageError<NodeId>;
/// Membership as stored with its log id.
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeAddr>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeAddr>;
/// A snapshot (meta + data handle).
pub type Snapshot = openraft::Snapshot<TypeConfig>;
/// Log state.
pub type LogState = openraft::storage::LogState<TypeConfig>;

/// Storage error for a failed read of `subject` (log, vote, state machine, snapshot).
pub fn read_error(subject: openraft::ErrorSubject<NodeId>, err: impl std::fmt::Display) -> StorageError {
    StorageError::from(openraft::StorageIOError::new(
        subject,
        openraft::ErrorVerb::Read,
        openraft::AnyError::error(err.to_string()),
    ))
}

/// Storage error for a failed write of `subject`.
pub fn write_error(subject: openraft::ErrorSubject<NodeId>, err: impl std::fmt::Display) -> StorageError {
    StorageError::from(openraft::StorageIOError::new(
        subject,
        openraft::ErrorVerb::Write,
        openraft::AnyError::error(err.to_string()),
    ))
}

/// Converts any displayable error into an `io::Error` (for the log flush callback).
pub fn io_error(err: impl std::fmt::Display) -> io::Error {
    io::Error::other(err.to_string())
}
