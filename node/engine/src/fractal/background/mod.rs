//! The engine's background threads, each named for what it does: the [`cleaner`] flushes
//! internal buffers once writes pause, [`writeback`] encodes and writes dirty nodes and spilled
//! runs beside the writer, [`leaf_flusher`] merges a node's worth of spilled runs into their
//! leaf. [`worker`] is the job-channel thread the last two share.

pub(crate) mod cleaner;
pub(crate) mod leaf_flusher;
pub(crate) mod worker;
pub(crate) mod writeback;
