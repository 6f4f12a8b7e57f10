//! ftkv's wire protocol: types and tonic client/server stubs generated from
//! `proto/ftkv/v1/kv.proto` (client API: `ftkv.v1.Kv`, `ftkv.v1.Cluster`) and
//! `proto/ftkv/raft/v1/raft.proto` (peer RPCs: `ftkv.raft.v1.Raft`).
//!
//! Generated at build time in pure Rust (protox + tonic-prost-build); needs no
//! system `protoc`. Depends on nothing of ftkv itself.
#![allow(clippy::all, missing_docs)]

/// Client API, version 1.
pub mod v1 {
    tonic::include_proto!("ftkv.v1");
}

/// Peer-to-peer Raft transport.
pub mod raft {
    /// Version 1 of the peer protocol.
    pub mod v1 {
        tonic::include_proto!("ftkv.raft.v1");
    }
}

/// Encoded `FileDescriptorSet` of every ftkv proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ftkv_descriptor");
