//! The fractal tree (Bε-tree) engine, after PerconaFT/TokuDB (`ft/` in percona/PerconaFT).
//!
//! Layout, one concern per folder (everything but the API re-exported below is `pub(crate)`):
//! - `msg/`: messages with MSNs and the per-child message buffers.
//! - `node/`: internal nodes (pivots + buffers) and leaves (basement nodes).
//! - `tree/`: injection, flushing, spills, splits and merges, reads, bulk build, integrity.
//! - `store/`: block I/O, the cachetable, the partial-read side cache, runs, writeback and
//!   checkpoint jobs.
//! - `codec/`: the on-disk encoding (documented byte by byte in `node/engine/FORMAT.md`).
//! - `background/`: the cleaner, writeback and leaf-flusher threads.
//! - `space`: the block allocator and which checkpoints still claim which blocks.
//! - `limits`: every bound of the engine, with compile-time checks of how they relate.
//!
//! The write path, read path, durability and recovery across the crates: `docs/ARCHITECTURE.md`.
//!
//! One file `tree.ftkv` in the engine directory holds everything. Writes become messages
//! injected at the root; [`Engine::checkpoint`] writes dirty nodes to fresh blocks and commits
//! the BTT (with the metadata blob) under the alternate header, so a reopen returns exactly the
//! last checkpoint. A checkpoint holds the engine lock only to take references to the dirty
//! nodes and to adopt the written blocks afterwards; encoding, writing and syncing run beside
//! the writers, which copy a node the checkpoint still holds before changing it. All I/O goes through [`ftkv_vfs::Vfs`], so crash tests run on `FaultVfs`.
//!
//! Reads: a point read collects the messages for its key from each ancestor buffer (skipping
//! buffers whose key filter rules the key out) and applies those newer than the basement's
//! applied MSN. A leaf that is not cached is read one basement at a time (header, pivots and the
//! one partition); an internal node that is not cached is read as partition 0 (pivots, children,
//! a Bloom key filter per child buffer) plus, only when the filter lets the key through, the one
//! buffer on the key's path. Scans merge a basement's packed entries with the pending messages in
//! key order, copying only the rows returned.
//!
//! Beyond the cache: a gorged buffer whose child is not cached spills its point messages to an
//! immutable run on disk instead of reading the child; a buffer's runs merge into the child once
//! they add up to a node (16 small runs first merge into one), so a leaf is rewritten once per
//! node's worth of messages instead of once per sixteenth (SplinterDB's size-tiered Bε-tree,
//! Conway et al., USENIX ATC 2020). Under cache pressure (the engine's memory over three
//! quarters of the budget) internal nodes below the root gorge at a quarter node, so they stay
//! cached. Runs merged into an internal node are handed down: the messages for its children
//! that are not cached go straight into new runs for them (with what its buffer holds for them)
//! instead of through its buffers. Runs are cut into frames of ~4 KiB (raw), compressed one by
//! one, behind a fence-key index, so a lookup whose key a run's filter accepts decompresses one
//! frame.
//!
//! Sequential inserts: a point message beyond the last key of the rightmost leaf (or before the
//! first of the leftmost), with nothing pending for that edge on the way down, is applied straight
//! to the cached edge leaf; edge leaves split unevenly, so sequential loads leave full leaves.
//!
//! Background work: two threads beside the writer. the leaf flusher (`background/leaf_flusher.rs`) applies a node's worth of
//! spilled runs to their (uncached) leaf: it reads and decompresses the leaf and the runs and
//! merges them while the writer goes on; the writer installs the result (the runs leave the
//! buffer, the leaf splits). writeback (`background/writeback.rs`) encodes (compresses) and writes spilled runs and
//! dirty nodes: the runs the writer spilled (readable from memory until their block is
//! adopted; a checkpoint writes those still pending; at most an eighth of the budget waits,
//! beyond that the writer encodes a run itself), the leaves a flush produced (then evicted),
//! dirty eviction victims (evicted once written; they stay cached meanwhile, counted in the
//! background share, and the writer encodes a victim itself only when that share is full) and
//! idle dirty nodes when too many are dirty. The writer waits for writeback only when the
//! engine's memory runs over budget (back-pressure).
//! A quarter of the budget stays free for the background threads (a flush in flight reserves
//! its decoded leaf and runs from it, at most one quarter's worth at a time); a buffer whose
//! flush cannot start yet keeps spilling runs, up to two nodes' worth, before the writer
//! flushes it itself.
//!
//! Reads beyond the cache: a point read through a node that is not cached reads pieces, not
//! the node: the header and partition 0 (pivots, key filters, frame tables; kept in a side
//! cache of partial reads), then one ~4 KiB frame of the buffer or basement on the key's path.
//! Partial eviction (PerconaFT evicts a clean leaf's basements but keeps the node): whenever a
//! leaf block is written or read whole, its skeleton (partition table, pivots, frame tables)
//! goes to that side cache, so when the cache evicts the clean leaf its basements leave memory
//! and a later lookup reads one frame. When the leaf's frame table is cached, that frame is
//! read under the shared lock and the key looked up in it in place; a decoded frame is kept in
//! the side cache only when the frame is read a second time while a small doorkeeper still
//! remembers its first read (random reads over more data than memory rarely read a frame twice,
//! and the page cache holds it compressed at half the size). The side cache holds a quarter of
//! the budget, or what the node cache leaves free; it gives decoded frames back first and
//! skeletons last.
//!
//! The cleaner (`background/cleaner.rs`): a third thread flushes internal buffers once writes pause (PerconaFT's
//! cleaner thread): every second, when no write came for a second, it flushes the fullest
//! cached internal node's heaviest buffer, one buffer per hold of the engine lock, until every
//! cached internal node holds less than half its gorge limit (a quarter node below the root
//! under cache pressure), so the next burst of writes finds room instead of running the flush
//! cascade itself. While writes come, flushes stay inside them (measured: a cleaner taking
//! turns with the writer under the one engine lock cost 5-10% of insert speed).
//!
//! Not yet built (see issue 3): hole punching of freed blocks (they are reused and the file
//! tail is cut). Write-ahead logging is outside the engine: a node replays its Raft log, and
//! embedded mode (crate `ftkv-embedded`) replays its own instance of the log.

//! Concurrency: a read-write lock guards the tree. Reads whose nodes are all cached run
//! concurrently under the shared lock (CLOCK counts are atomics), and so do point reads that
//! need one frame of a leaf whose skeleton is cached; a read that misses otherwise retries
//! under the exclusive lock, loading nodes and evicting. Writes take the exclusive lock.
mod background;
mod bulk;
#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod cleaner_tests;
mod codec;
mod engine;
mod filter;
mod inner;
mod limits;
mod msg;
mod node;
mod open;
mod options;
mod space;
mod store;
#[cfg(test)]
mod test_support;
mod tree;
mod write_ops;

pub use self::background::leaf_flusher::FlushTotals;
pub use self::background::writeback::WritebackTotals;
pub use self::engine::FractalEngine;
pub use self::options::{FractalOptions, TreeParams, DEFAULT_CLEANER_PERIOD_MS};
pub use self::store::checkpoint::CheckpointStats;
pub use self::store::stats::{CompressionStats, EvictionStats, MemoryUse, PartialReadStats};
pub use self::tree::SpillStats;

use self::engine::io;
use self::{inner::*, open::*, write_ops::*};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ftkv_vfs::{Vfs, VfsFile};
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use self::background::cleaner::{Cleaner, Step};
use self::background::leaf_flusher::Flusher;
use self::background::writeback::Writeback;
use self::codec::{decode_btt, decode_header, BlockLoc, BttImage, Header, HEADER_BYTES, HEADER_SLOT_BYTES};
use self::msg::{Msg, Msn, PointOp, RangeMsg, RangeOp};
use self::node::{Leaf, Node};
use self::store::Store;
use self::tree::Tree;
use crate::{Engine, EngineError, EngineKind, EngineOptions, IntegrityReport, KeyValue, Result, WriteOp};

/// File name of the tree inside the engine directory.
pub const TREE_FILE_NAME: &str = "tree.ftkv";
const TREE_TMP_NAME: &str = "tree.ftkv.tmp";
