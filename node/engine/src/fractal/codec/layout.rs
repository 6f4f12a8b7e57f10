//! Format constants, block locations, the header and BTT images.

use super::*;

/// Format version written and read by this build: the only one (the format is frozen; blocks
/// and headers of any other version are refused with `UnsupportedVersion`).
pub(crate) const FORMAT_VERSION: u32 = 4;
/// Bytes of each of the two header slots (at offsets 0 and `HEADER_SLOT_BYTES`).
pub(crate) const HEADER_SLOT_BYTES: u64 = 4096;
/// First byte of the block area.
pub(crate) const DATA_START: u64 = 2 * HEADER_SLOT_BYTES;
/// Blocks are allocated in multiples of this (the sector size).
pub(crate) const BLOCK_ALIGN_BYTES: u64 = 512;
/// Encoded header length (the rest of the slot is zero).
pub(crate) const HEADER_BYTES: usize = 64;

pub(crate) const HEADER_MAGIC: &[u8; 8] = b"FTKVHDR\0";
pub(crate) const BTT_MAGIC: &[u8; 8] = b"FTKVBTT\0";
/// Magic at the start of every node block.
pub(crate) const NODE_MAGIC: &[u8; 8] = b"FTKVNODE";
pub(crate) const RUN_MAGIC: &[u8; 8] = b"FTKVRUN\0";
/// Bytes of the fixed part of a node header (before the partition table).
pub(crate) const NODE_FIXED_HEADER_BYTES: usize = 40;
pub(crate) const PARTITION_ENTRY_BYTES: usize = 16;

/// Where a block lives in the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct BlockLoc {
    /// Byte offset in the file.
    pub(crate) offset: u64,
    /// Encoded length in bytes (the allocation is rounded up to `BLOCK_ALIGN_BYTES`).
    pub(crate) size: u32,
    /// crc32c of the whole encoded block.
    pub(crate) crc: u32,
}

impl BlockLoc {
    /// Allocated bytes (size rounded up to the alignment).
    pub(crate) fn alloc_bytes(&self) -> u64 {
        align_up(u64::from(self.size))
    }
}

/// Rounds `n` up to `BLOCK_ALIGN_BYTES`.
pub(crate) fn align_up(n: u64) -> u64 {
    n.div_ceil(BLOCK_ALIGN_BYTES) * BLOCK_ALIGN_BYTES
}

/// A checkpoint header (one per slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// Increases by one per checkpoint; the valid header with the highest counter wins.
    pub(crate) counter: u64,
    /// Location of the BTT block of this checkpoint.
    pub(crate) btt: BlockLoc,
}

/// The contents of a BTT block: the tree's roots and the node map of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BttImage {
    /// Checkpoint counter (must equal the header's).
    pub(crate) counter: u64,
    /// Root node id.
    pub(crate) root: NodeId,
    /// Next MSN to assign.
    pub(crate) next_msn: Msn,
    /// Next node id to assign.
    pub(crate) next_node_id: NodeId,
    /// The state machine's metadata blob.
    pub(crate) meta: Option<Vec<u8>>,
    /// Node id -> block.
    pub(crate) entries: Vec<(NodeId, BlockLoc)>,
}
